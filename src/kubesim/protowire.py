"""Answers in the Kubernetes protobuf encoding (``application/vnd.kubernetes.protobuf``), as a real API server
sends them for built-in kinds; custom resources have no protobuf form and are always JSON.

The wire format, read in k8s.io/apimachinery (v0.36):

- A body (an object, a list, a ``Status``) is the 4 magic bytes ``k8s\\x00`` and a ``runtime.Unknown``
  message: ``typeMeta`` (1: ``apiVersion`` 1, ``kind`` 2), ``raw`` (2: the object's own message),
  ``contentEncoding`` (3) and ``contentType`` (4), both empty and both written
  (``runtime/serializer/protobuf/protobuf.go``, ``runtime/types_proto.go`` ``NestedMarshalTo``).
- A watch answers ``Content-Type: application/vnd.kubernetes.protobuf;stream=watch``: each event is a frame
  of a 4-byte big-endian length and a ``metav1.WatchEvent`` (``type`` 1, ``object`` 2: a ``RawExtension``
  whose ``raw`` 1 is the object encoded as a body above), written by the raw serializer without the magic
  bytes (``util/framer`` ``NewLengthDelimitedFrameWriter``; apiserver ``endpoints/handlers/watch.go``: the
  frame's encoder is the stream serializer, the object's the negotiated one).
- Fields are written in field-number order, maps as entries sorted by key; ``metav1.Time`` is its Unix
  seconds (``seconds`` 1, ``nanos`` 2 = 0; ``time_proto.go`` drops sub-second precision), ``MicroTime``
  keeps microseconds, ``resource.Quantity`` is its string, ``intstr.IntOrString`` ``type``/``intVal``/
  ``strVal``, ``RawExtension`` and ``FieldsV1`` carry their JSON as bytes; an embedded struct the JSON
form inlines (``Volume``'s ``VolumeSource``, ``Probe``'s ``ProbeHandler``) is a message of its own.

The field tables come from the upstream ``generated.proto`` files (``protos.json``, made by
``tools/kubesim_protos.py``). Simplified: a field is written when kubesim's stored object has it, where
Go's generated marshaller also writes a non-pointer field at its zero value (an empty string, a 0) — a
decoder sees the same values either way, a real server's bodies are a few bytes longer.

Content negotiation (``accepts``) follows the apiserver's: the first media type of ``Accept`` the server
can produce for the resource wins (``*/*`` and ``application/*`` take JSON); a custom resource asked for in
protobuf alone is ``406 Not Acceptable``.
"""

from __future__ import annotations

import base64
import calendar
import json
import struct
import time
from functools import cache
from importlib import resources
from typing import Any

from kubesim.errors import ApiError
from kubesim.resources import ResourceType

__all__ = [
    "MEDIA_TYPE",
    "WATCH_MEDIA_TYPE",
    "accepts",
    "encode_body",
    "encode_message",
    "frame",
    "message_of",
]

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
WATCH_MEDIA_TYPE = MEDIA_TYPE + ";stream=watch"
_MAGIC = b"k8s\x00"
_META = "k8s.io.apimachinery.pkg.apis.meta.v1."
_PACKAGES = {
    "": "k8s.io.api.core",
    "batch": "k8s.io.api.batch",
    "apps": "k8s.io.api.apps",
    "coordination.k8s.io": "k8s.io.api.coordination",
    "storage.k8s.io": "k8s.io.api.storage",
    "rbac.authorization.k8s.io": "k8s.io.api.rbac",
    "events.k8s.io": "k8s.io.api.events",
    "authorization.k8s.io": "k8s.io.api.authorization",
    "authentication.k8s.io": "k8s.io.api.authentication",
}


@cache
def _messages() -> dict[str, dict[str, list[Any]]]:
    text = resources.files("kubesim").joinpath("protos.json").read_text()
    out: dict[str, dict[str, list[Any]]] = json.loads(text)["messages"]
    return out


@cache
def _ordered(message: str) -> tuple[tuple[str, int, str, str], ...]:
    """The fields of ``message`` in field-number order: (name, number, type, label)."""
    fields = _messages()[message]
    return tuple(sorted(((n, f[0], f[1], f[2]) for n, f in fields.items()), key=lambda f: f[1]))


def message_of(rt: ResourceType, kind: str | None = None) -> str | None:
    """The protobuf message of ``kind`` (default: the resource's) in the resource's group/version, or
    ``None`` when the resource has none (a custom resource)."""
    package = _PACKAGES.get(rt.group)
    if package is None:
        return None
    name = f"{package}.{rt.version}.{kind or rt.kind}"
    return name if name in _messages() else None


def accepts(accept: str | None, rt: ResourceType | None) -> str:
    """The media type to answer with for ``Accept`` (``MEDIA_TYPE`` or ``application/json``); 406 when the
    client takes neither (protobuf alone, for a resource that has no protobuf form)."""
    if not accept or not accept.strip():
        return "application/json"
    proto = rt is not None and message_of(rt) is not None
    for part in accept.split(","):
        media = part.split(";")[0].strip().lower()
        if media == MEDIA_TYPE and proto:
            return MEDIA_TYPE
        if media in ("application/json", "application/*", "*/*"):
            return "application/json"
    if any(part.split(";")[0].strip().lower() == MEDIA_TYPE for part in accept.split(",")):
        raise ApiError(
            406,
            "NotAcceptable",
            "only the following media types are accepted: application/json, application/yaml",
        )
    return "application/json"  # a table, yaml or anything else: the JSON paths decide


# --- the wire ------------------------------------------------------------------------------------


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # negative int32/int64 as ten bytes of two's complement, as Go writes them
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _delimited(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _seconds(text: str) -> tuple[int, int]:
    """RFC 3339 (``2026-01-02T03:04:05Z``, ``...05.123456Z``, with an offset) -> Unix seconds, nanos."""
    main, frac = text, ""
    offset = 0
    if main.endswith("Z"):
        main = main[:-1]
    elif len(main) > 6 and main[-6] in "+-" and main[-3] == ":":
        sign = 1 if main[-6] == "+" else -1
        offset = sign * (int(main[-5:-3]) * 3600 + int(main[-2:]) * 60)
        main = main[:-6]
    if "." in main:
        main, frac = main.split(".", 1)
    secs = calendar.timegm(time.strptime(main, "%Y-%m-%dT%H:%M:%S")) - offset
    nanos = int((frac + "000000000")[:9]) if frac else 0
    return secs, nanos


def _time(value: Any, micro: bool) -> bytes:
    secs, nanos = _seconds(str(value))
    return b"\x08" + _varint(secs) + b"\x10" + _varint(nanos if micro else 0)


def _scalar(number: int, typ: str, value: Any) -> bytes:
    if typ == "string":
        return _delimited(number, str(value).encode())
    if typ == "bytes":  # JSON carries bytes as base64
        return _delimited(number, base64.b64decode(value) if isinstance(value, str) else bytes(value))
    if typ == "bool":
        return _varint(number << 3) + (b"\x01" if value else b"\x00")
    if typ in ("int32", "int64", "uint32", "uint64"):
        return _varint(number << 3) + _varint(int(value))
    if typ == "double":
        return _varint(number << 3 | 1) + struct.pack("<d", float(value))
    if typ == "float":
        return _varint(number << 3 | 5) + struct.pack("<f", float(value))
    raise TypeError(f"no encoding for the scalar type {typ}")


def _value(number: int, typ: str, value: Any) -> bytes:
    if typ == _META + "Time" or typ == _META + "MicroTime":
        return _delimited(number, _time(value, typ.endswith("MicroTime")))
    if typ == "k8s.io.apimachinery.pkg.api.resource.Quantity":
        return _delimited(number, _delimited(1, str(value).encode()))
    if typ == "k8s.io.apimachinery.pkg.util.intstr.IntOrString":
        if isinstance(value, int) and not isinstance(value, bool):
            body = b"\x08\x00\x10" + _varint(value) + b"\x1a\x00"
        else:
            body = b"\x08\x01\x10\x00" + _delimited(3, str(value).encode())
        return _delimited(number, body)
    if typ == "k8s.io.apimachinery.pkg.runtime.RawExtension" or typ == _META + "FieldsV1":
        raw = json.dumps(value, separators=(",", ":")).encode()
        return _delimited(number, _delimited(1, raw))
    if typ == _META + "Duration":
        return _delimited(number, b"\x08" + _varint(_duration(value)))
    if typ in _messages():
        if not isinstance(value, dict):
            raise TypeError(f"expected an object for {typ}, got {type(value).__name__}")
        return _delimited(number, encode_message(typ, value))
    return _scalar(number, typ, value)


_UNITS = {"h": 3600 * 10**9, "m": 60 * 10**9, "s": 10**9, "ms": 10**6, "us": 10**3, "µs": 10**3, "ns": 1}


def _duration(value: Any) -> int:
    """A Go duration string (``1m30s``) in nanoseconds."""
    import re

    text = str(value)
    total = 0.0
    for num, unit in re.findall(r"([0-9.]+)(h|ms|us|µs|ns|m|s)", text):
        total += float(num) * _UNITS[unit]
    return int(-total if text.startswith("-") else total)


def encode_message(message: str, obj: dict[str, Any]) -> bytes:
    """``obj`` (a JSON object) as the protobuf message ``message``; fields it lacks, or holds as ``null``,
    are not written, and fields the message has no number for are left out (a Go struct has no place for
    them either)."""
    out: list[bytes] = []
    for name, number, typ, label in _ordered(message):
        if label == "i":  # an embedded struct whose fields the JSON form holds inline
            out.append(_delimited(number, encode_message(typ, obj)))
            continue
        value = obj.get(name)
        if value is None:
            continue
        if label == "r":
            out.extend(_value(number, typ, item) for item in value if item is not None)
        elif label.startswith("m:"):
            vtype = label[2:]
            for key in sorted(value):
                entry = _delimited(1, str(key).encode())
                if value[key] is not None:
                    entry += _value(2, vtype, value[key])
                out.append(_delimited(number, entry))
        else:
            out.append(_value(number, typ, value))
    return b"".join(out)


def _unknown(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = _delimited(1, api_version.encode()) + _delimited(2, kind.encode())
    return _delimited(1, type_meta) + _delimited(2, raw) + b"\x1a\x00\x22\x00"


def encode_body(rt: ResourceType, obj: dict[str, Any]) -> bytes:
    """A response body of resource ``rt`` (an object of it, its list, or a ``Status``) in protobuf: the
    magic bytes and a ``runtime.Unknown`` (see the module docstring)."""
    kind = str(obj.get("kind") or rt.kind)
    api_version = str(obj.get("apiVersion") or rt.api_version)
    if kind == "Status":
        message, api_version = _META + "Status", "v1"
    else:
        found = message_of(rt, kind)
        if found is None:
            raise TypeError(f"{kind} has no protobuf form")
        message = found
    return _MAGIC + _unknown(api_version, kind, encode_message(message, obj))


def frame(event_type: str, body: bytes) -> bytes:
    """One watch event as a length-prefixed frame of a ``metav1.WatchEvent`` whose object is ``body``
    (from :func:`encode_body`)."""
    event = _delimited(1, event_type.encode()) + _delimited(2, _delimited(1, body))
    return struct.pack(">I", len(event)) + event
