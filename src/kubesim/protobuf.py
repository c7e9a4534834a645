"""Just enough of the Kubernetes protobuf encoding to accept the few typed writes kubectl sends that way.

kubectl's typed clients (``kubectl create namespace|configmap``, ``kubectl auth can-i``) send
``application/vnd.kubernetes.protobuf`` bodies. kubesim answers in JSON (kubectl accepts it) and decodes
the request bodies of these kinds only: Namespace, ConfigMap, Secret and the self reviews
(SelfSubjectAccessReview, SelfSubjectRulesReview, SelfSubjectReview). Other kinds sent as protobuf are
answered 415.
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

from kubesim.errors import ApiError

__all__ = ["decode"]

_MAGIC = b"k8s\x00"
Fields = dict[int, list[Any]]


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while True:
        if i >= len(buf):
            raise ValueError("truncated varint")
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def _fields(buf: bytes) -> Fields:
    """Decode one message into field number -> values (ints for varints, bytes for length-delimited)."""
    out: Fields = {}
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        value: Any
        if wire == 0:
            value, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            value = buf[i : i + n]
            i += n
        elif wire == 1:
            value = buf[i : i + 8]
            i += 8
        elif wire == 5:
            value = buf[i : i + 4]
            i += 4
        else:
            raise ValueError(f"unsupported wire type {wire}")
        out.setdefault(num, []).append(value)
    return out


def _str(f: Fields, n: int) -> str | None:
    v = f.get(n)
    return v[-1].decode() if v else None


def _map(f: Fields, n: int, *, raw_values: bool = False) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for entry in f.get(n, []):
        e = _fields(entry)
        k = _str(e, 1) or ""
        if raw_values:
            out[k] = base64.b64encode(e.get(2, [b""])[-1]).decode()
        else:
            out[k] = _str(e, 2) or ""
    return out


def _meta(buf: bytes) -> dict[str, Any]:
    f = _fields(buf)
    meta: dict[str, Any] = {}
    for num, key in ((1, "name"), (2, "generateName"), (3, "namespace"), (6, "resourceVersion"), (5, "uid")):
        v = _str(f, num)
        if v:
            meta[key] = v
    for num, key in ((11, "labels"), (12, "annotations")):
        m = _map(f, num)
        if m:
            meta[key] = m
    fins = [b.decode() for b in f.get(14, [])]
    if fins:
        meta["finalizers"] = fins
    return meta


def _namespace(f: Fields) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": _meta(f.get(1, [b""])[-1])}


def _configmap(f: Fields) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(f.get(1, [b""])[-1])}
    if f.get(2):
        obj["data"] = _map(f, 2)
    if f.get(3):
        obj["binaryData"] = _map(f, 3, raw_values=True)
    if f.get(4):
        obj["immutable"] = bool(f[4][-1])
    return obj


def _secret(f: Fields) -> dict[str, Any]:
    obj: dict[str, Any] = {"apiVersion": "v1", "kind": "Secret", "metadata": _meta(f.get(1, [b""])[-1])}
    if f.get(2):
        obj["data"] = _map(f, 2, raw_values=True)
    if f.get(3):
        obj["type"] = _str(f, 3)
    if f.get(4):
        obj["stringData"] = _map(f, 4)
    return obj


def _ssar(f: Fields) -> dict[str, Any]:
    spec_f = _fields(f.get(2, [b""])[-1])
    spec: dict[str, Any] = {}
    if spec_f.get(1):
        ra = _fields(spec_f[1][-1])
        attrs = {}
        names = ("namespace", "verb", "group", "version", "resource", "subresource", "name")
        for num, key in enumerate(names, start=1):
            v = _str(ra, num)
            if v:
                attrs[key] = v
        spec["resourceAttributes"] = attrs
    if spec_f.get(2):
        nra = _fields(spec_f[2][-1])
        spec["nonResourceAttributes"] = {k: _str(nra, n) or "" for n, k in ((1, "path"), (2, "verb"))}
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "metadata": {},
        "spec": spec,
    }


def _ssrr(f: Fields) -> dict[str, Any]:
    spec_f = _fields(f.get(2, [b""])[-1])
    spec: dict[str, Any] = {}
    ns = _str(spec_f, 1)
    if ns:
        spec["namespace"] = ns
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectRulesReview",
        "metadata": {},
        "spec": spec,
    }


def _ssr(f: Fields) -> dict[str, Any]:
    return {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview", "metadata": {}}


_DECODERS: dict[tuple[str, str], Callable[[Fields], dict[str, Any]]] = {
    ("v1", "Namespace"): _namespace,
    ("v1", "ConfigMap"): _configmap,
    ("v1", "Secret"): _secret,
    ("authorization.k8s.io/v1", "SelfSubjectAccessReview"): _ssar,
    ("authorization.k8s.io/v1", "SelfSubjectRulesReview"): _ssrr,
    ("authentication.k8s.io/v1", "SelfSubjectReview"): _ssr,
}


def _unsupported(detail: str) -> ApiError:
    return ApiError(
        415,
        "UnsupportedMediaType",
        "the body of the request was in an unknown format - accepted media types include: "
        f"application/json, application/yaml ({detail})",
    )


def decode(body: bytes) -> dict[str, Any]:
    """Decode a protobuf request body of a supported kind into its JSON form; ApiError 415 otherwise."""
    if not body.startswith(_MAGIC):
        raise _unsupported("not a Kubernetes protobuf envelope")
    try:
        env = _fields(body[len(_MAGIC) :])
        tm = _fields(env.get(1, [b""])[-1])
        api_version, kind = _str(tm, 1) or "", _str(tm, 2) or ""
        decoder = _DECODERS.get((api_version, kind))
        if decoder is None:
            raise _unsupported(f"kubesim decodes protobuf only for {sorted(k for _, k in _DECODERS)}")
        return decoder(_fields(env.get(2, [b""])[-1]))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "BadRequest", f"the protobuf request body could not be decoded: {exc}") from None
