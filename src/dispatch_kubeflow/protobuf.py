"""The Kubernetes protobuf encoding, read: what the API server sends for built-in kinds when asked for
``application/vnd.kubernetes.protobuf`` (client-go's controllers ask so), decoded into the JSON-shaped dicts
the rest of the adapter reads — only the fields it reads.

The adapter asks for protobuf where it reads many built-in objects: lists and watches of pods, Jobs, Events,
nodes and namespaces (:func:`wanted`), with ``Accept: application/vnd.kubernetes.protobuf, application/json``
so that a server (or proxy) that cannot answer in protobuf answers in JSON. Custom resources (TrainJobs,
JobSets, Workloads) have no protobuf form: they are always JSON.

The wire format (k8s.io/apimachinery; docs/kubesim.md cites the files):

- a body is the magic bytes ``k8s\\x00`` then a ``runtime.Unknown``: ``typeMeta`` (1: ``apiVersion`` 1,
  ``kind`` 2) and ``raw`` (2: the object's message);
- a watch (``;stream=watch``) is a sequence of frames, each a 4-byte big-endian length and a
  ``metav1.WatchEvent``: ``type`` (1) and ``object`` (2, a ``RawExtension`` whose ``raw`` 1 is a body);
- ``metav1.Time`` is ``seconds``/``nanos``, shown as RFC 3339 seconds as in JSON (``MicroTime`` with
  microseconds); ``resource.Quantity`` is a message holding its string.

Field numbers are upstream's (``generated.proto`` of k8s.io/api and apimachinery v0.36);
``tests/kubesim/core/test_protobuf.py`` holds them equal to the tables kubesim encodes with. A field of
no interest is skipped unread. Zero values a Go server writes for fields it always writes (an empty
string) are dropped, as JSON's ``omitempty`` drops them; numbers and booleans are kept.
"""

from __future__ import annotations

import struct
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = [
    "ACCEPT",
    "MEDIA_TYPE",
    "DecodeError",
    "decode_body",
    "decode_frame",
    "frames",
    "is_protobuf",
    "wanted",
]

MEDIA_TYPE = "application/vnd.kubernetes.protobuf"
ACCEPT = f"{MEDIA_TYPE}, application/json"
_MAGIC = b"k8s\x00"

# message -> field number -> (JSON name, type, label). Not read: annotations (the adapter reads those of
# TrainJobs, which are JSON; half a pod's bytes are JobSet's annotations), managed fields, specs beyond the
# containers' names and images. Types: s string, i integer (int32/int64), b bool,
# T metav1.Time, U metav1.MicroTime, Q resource.Quantity, or a message of this table; labels: "" one,
# r repeated, m a map from string.
_TABLE: dict[str, dict[int, tuple[str, str, str]]] = {
    "ObjectMeta": {
        1: ("name", "s", ""),
        2: ("generateName", "s", ""),
        3: ("namespace", "s", ""),
        5: ("uid", "s", ""),
        6: ("resourceVersion", "s", ""),
        7: ("generation", "i", ""),
        8: ("creationTimestamp", "T", ""),
        9: ("deletionTimestamp", "T", ""),
        10: ("deletionGracePeriodSeconds", "i", ""),
        11: ("labels", "s", "m"),
        13: ("ownerReferences", "OwnerReference", "r"),
        14: ("finalizers", "s", "r"),
    },
    "OwnerReference": {
        5: ("apiVersion", "s", ""),
        1: ("kind", "s", ""),
        3: ("name", "s", ""),
        4: ("uid", "s", ""),
        6: ("controller", "b", ""),
        7: ("blockOwnerDeletion", "b", ""),
    },
    "ListMeta": {
        2: ("resourceVersion", "s", ""),
        3: ("continue", "s", ""),
        4: ("remainingItemCount", "i", ""),
    },
    "Status": {
        1: ("metadata", "ListMeta", ""),
        2: ("status", "s", ""),
        3: ("message", "s", ""),
        4: ("reason", "s", ""),
        5: ("details", "StatusDetails", ""),
        6: ("code", "i", ""),
    },
    "StatusDetails": {
        1: ("name", "s", ""),
        2: ("group", "s", ""),
        3: ("kind", "s", ""),
        6: ("uid", "s", ""),
        4: ("causes", "StatusCause", "r"),
        5: ("retryAfterSeconds", "i", ""),
    },
    "StatusCause": {1: ("reason", "s", ""), 2: ("message", "s", ""), 3: ("field", "s", "")},
    "Pod": {1: ("metadata", "ObjectMeta", ""), 2: ("spec", "PodSpec", ""), 3: ("status", "PodStatus", "")},
    "PodList": {1: ("metadata", "ListMeta", ""), 2: ("items", "Pod", "r")},
    "PodSpec": {
        2: ("containers", "Container", "r"),
        20: ("initContainers", "Container", "r"),
        3: ("restartPolicy", "s", ""),
        10: ("nodeName", "s", ""),
        7: ("nodeSelector", "s", "m"),
        38: ("schedulingGates", "PodSchedulingGate", "r"),
        24: ("priorityClassName", "s", ""),
    },
    "Container": {1: ("name", "s", ""), 2: ("image", "s", "")},
    "PodSchedulingGate": {1: ("name", "s", "")},
    "PodStatus": {
        1: ("phase", "s", ""),
        2: ("conditions", "PodCondition", "r"),
        3: ("message", "s", ""),
        4: ("reason", "s", ""),
        5: ("hostIP", "s", ""),
        6: ("podIP", "s", ""),
        7: ("startTime", "T", ""),
        8: ("containerStatuses", "ContainerStatus", "r"),
        10: ("initContainerStatuses", "ContainerStatus", "r"),
        11: ("nominatedNodeName", "s", ""),
    },
    "PodCondition": {
        1: ("type", "s", ""),
        2: ("status", "s", ""),
        3: ("lastProbeTime", "T", ""),
        4: ("lastTransitionTime", "T", ""),
        5: ("reason", "s", ""),
        6: ("message", "s", ""),
    },
    "ContainerStatus": {
        1: ("name", "s", ""),
        2: ("state", "ContainerState", ""),
        3: ("lastState", "ContainerState", ""),
        4: ("ready", "b", ""),
        5: ("restartCount", "i", ""),
        6: ("image", "s", ""),
        7: ("imageID", "s", ""),
        8: ("containerID", "s", ""),
        9: ("started", "b", ""),
    },
    "ContainerState": {
        1: ("waiting", "ContainerStateWaiting", ""),
        2: ("running", "ContainerStateRunning", ""),
        3: ("terminated", "ContainerStateTerminated", ""),
    },
    "ContainerStateWaiting": {1: ("reason", "s", ""), 2: ("message", "s", "")},
    "ContainerStateRunning": {1: ("startedAt", "T", "")},
    "ContainerStateTerminated": {
        1: ("exitCode", "i", ""),
        2: ("signal", "i", ""),
        3: ("reason", "s", ""),
        4: ("message", "s", ""),
        5: ("startedAt", "T", ""),
        6: ("finishedAt", "T", ""),
        7: ("containerID", "s", ""),
    },
    "Job": {1: ("metadata", "ObjectMeta", ""), 2: ("spec", "JobSpec", ""), 3: ("status", "JobStatus", "")},
    "JobList": {1: ("metadata", "ListMeta", ""), 2: ("items", "Job", "r")},
    "JobSpec": {
        1: ("parallelism", "i", ""),
        2: ("completions", "i", ""),
        3: ("activeDeadlineSeconds", "i", ""),
        7: ("backoffLimit", "i", ""),
        9: ("completionMode", "s", ""),
        10: ("suspend", "b", ""),
    },
    "JobStatus": {
        1: ("conditions", "JobCondition", "r"),
        2: ("startTime", "T", ""),
        3: ("completionTime", "T", ""),
        4: ("active", "i", ""),
        5: ("succeeded", "i", ""),
        6: ("failed", "i", ""),
        9: ("ready", "i", ""),
        11: ("terminating", "i", ""),
    },
    "JobCondition": {
        1: ("type", "s", ""),
        2: ("status", "s", ""),
        3: ("lastProbeTime", "T", ""),
        4: ("lastTransitionTime", "T", ""),
        5: ("reason", "s", ""),
        6: ("message", "s", ""),
    },
    "Event": {
        1: ("metadata", "ObjectMeta", ""),
        2: ("involvedObject", "ObjectReference", ""),
        3: ("reason", "s", ""),
        4: ("message", "s", ""),
        5: ("source", "EventSource", ""),
        6: ("firstTimestamp", "T", ""),
        7: ("lastTimestamp", "T", ""),
        8: ("count", "i", ""),
        9: ("type", "s", ""),
        10: ("eventTime", "U", ""),
        12: ("action", "s", ""),
        13: ("related", "ObjectReference", ""),
        14: ("reportingComponent", "s", ""),
        15: ("reportingInstance", "s", ""),
    },
    "EventList": {1: ("metadata", "ListMeta", ""), 2: ("items", "Event", "r")},
    "EventSource": {1: ("component", "s", ""), 2: ("host", "s", "")},
    "ObjectReference": {
        1: ("kind", "s", ""),
        2: ("namespace", "s", ""),
        3: ("name", "s", ""),
        4: ("uid", "s", ""),
        5: ("apiVersion", "s", ""),
        6: ("resourceVersion", "s", ""),
        7: ("fieldPath", "s", ""),
    },
    "Namespace": {1: ("metadata", "ObjectMeta", ""), 3: ("status", "NamespaceStatus", "")},
    "NamespaceStatus": {1: ("phase", "s", "")},
    "Node": {1: ("metadata", "ObjectMeta", ""), 2: ("spec", "NodeSpec", ""), 3: ("status", "NodeStatus", "")},
    "NodeList": {1: ("metadata", "ListMeta", ""), 2: ("items", "Node", "r")},
    "NodeSpec": {4: ("unschedulable", "b", ""), 5: ("taints", "Taint", "r")},
    "Taint": {1: ("key", "s", ""), 2: ("value", "s", ""), 3: ("effect", "s", ""), 4: ("timeAdded", "T", "")},
    "NodeStatus": {
        1: ("capacity", "Q", "m"),
        2: ("allocatable", "Q", "m"),
        3: ("phase", "s", ""),
        4: ("conditions", "NodeCondition", "r"),
    },
    "NodeCondition": {
        1: ("type", "s", ""),
        2: ("status", "s", ""),
        3: ("lastHeartbeatTime", "T", ""),
        4: ("lastTransitionTime", "T", ""),
        5: ("reason", "s", ""),
        6: ("message", "s", ""),
    },
}

_KINDS = {"Pod", "PodList", "Job", "JobList", "Event", "EventList", "Namespace", "Node", "NodeList", "Status"}
_PATHS = {
    "/api/v1/": ("pods", "events", "namespaces", "nodes"),
    "/apis/batch/v1/": ("jobs",),
}


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class DecodeError(ValueError):
    """Bytes that are not a Kubernetes protobuf body or watch frame (of a kind this module reads)."""


def wanted(path: str) -> bool:
    """Whether a GET of ``path`` is answered in protobuf when asked: a list, get or watch of one of the
    built-in kinds this module reads (not a subresource such as ``pods/x/log``)."""
    for prefix, resources in _PATHS.items():
        if path.startswith(prefix):
            parts = path[len(prefix) :].strip("/").split("/")
            if parts[:1] == ["namespaces"] and len(parts) >= 3:
                parts = parts[2:]
            elif parts[:1] == ["namespaces"]:
                return "namespaces" in resources and len(parts) <= 2
            return bool(parts) and parts[0] in resources and len(parts) <= 2
    return False


def is_protobuf(content_type: str | None) -> bool:
    return bool(content_type) and content_type.split(";")[0].strip().lower() == MEDIA_TYPE  # type: ignore[union-attr]


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        try:
            b = buf[i]
        except IndexError:
            raise DecodeError("a varint runs past the end") from None
        i += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise DecodeError("a varint longer than ten bytes")


def _time(buf: bytes, micro: bool) -> str | None:
    seconds = nanos = 0
    for num, value in _scalars(buf):
        if num == 1:
            seconds = value - (1 << 64) if value >= 1 << 63 else value
        elif num == 2:
            nanos = value
    if not seconds and not nanos:
        return None  # the zero time: JSON's null
    try:
        stamp = (_EPOCH + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S")
    except (OverflowError, ValueError):
        raise DecodeError(f"a time out of range: {seconds}") from None
    return f"{stamp}.{nanos // 1000:06d}Z" if micro else f"{stamp}Z"


def _scalars(buf: bytes) -> list[tuple[int, int]]:
    out = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        if key & 7 != 0:
            i = _skip(buf, i, key & 7)
            continue
        value, i = _varint(buf, i)
        out.append((key >> 3, value))
    return out


def _skip(buf: bytes, i: int, wire: int) -> int:
    if wire == 0:
        return _varint(buf, i)[1]
    if wire == 1:
        i += 8
    elif wire == 2:
        n, i = _varint(buf, i)
        i += n
    elif wire == 5:
        i += 4
    else:
        raise DecodeError(f"wire type {wire} (groups are not used by Kubernetes)")
    if i > len(buf):
        raise DecodeError("a field runs past the end")
    return i


def _delimited(buf: bytes, i: int) -> tuple[bytes, int]:
    n, i = _varint(buf, i)
    end = i + n
    if end > len(buf):
        raise DecodeError("a field runs past the end")
    return buf[i:end], end


def _string(data: bytes) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise DecodeError("a string that is not UTF-8") from None


def _one(kind: str, wire: int, buf: bytes, i: int) -> tuple[Any, int]:
    """One value of type ``kind`` at ``i``; returns it and the next position."""
    if kind in ("i", "b"):
        if wire != 0:
            raise DecodeError(f"expected a varint, got wire type {wire}")
        value, i = _varint(buf, i)
        if kind == "b":
            return value != 0, i
        return (value - (1 << 64) if value >= 1 << 63 else value), i
    if wire != 2:
        raise DecodeError(f"expected a length-delimited field, got wire type {wire}")
    data, i = _delimited(buf, i)
    if kind == "s":
        return _string(data), i
    if kind in ("T", "U"):
        return _time(data, kind == "U"), i
    if kind == "Q":
        return _quantity(data), i
    return _message(data, _TABLE[kind]), i


def _quantity(data: bytes) -> str:
    i = 0
    out = ""
    while i < len(data):
        key, i = _varint(data, i)
        if key == 0x0A:
            raw, i = _delimited(data, i)
            out = _string(raw)
        else:
            i = _skip(data, i, key & 7)
    return out


def _message(buf: bytes, fields: dict[int, tuple[str, str, str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    i = 0
    end = len(buf)
    while i < end:
        key = buf[i]  # a one-byte key and length are the rule (fields 1-15, values under 128 bytes)
        if key < 0x80:
            i += 1
        else:
            key, i = _varint(buf, i)
        found = fields.get(key >> 3)
        if found is None:
            i = _skip(buf, i, key & 7)
            continue
        name, kind, label = found
        if kind == "s" and key & 7 == 2 and label != "m":
            n = buf[i] if i < end else 0x80
            if n < 0x80:
                i += 1
            else:
                n, i = _varint(buf, i)
            if i + n > end:
                raise DecodeError("a field runs past the end")
            value: Any = _string(buf[i : i + n])
            i += n
        elif label == "m":
            if key & 7 != 2:
                raise DecodeError("a map entry that is not length-delimited")
            entry, i = _delimited(buf, i)
            k, v = _entry(entry, kind)
            found_map = out.get(name)
            if found_map is None:
                out[name] = found_map = {}
            found_map[k] = v
            continue
        else:
            value, i = _one(kind, key & 7, buf, i)
        if label == "r":
            out.setdefault(name, []).append(value)
        elif value is not None and value != "":
            out[name] = value
        else:
            out.pop(name, None)  # a later empty value replaces an earlier one, as in Go
    return out


def _entry(buf: bytes, kind: str) -> tuple[str, Any]:
    n = len(buf)
    # The rule: key (field 1) then a string value (field 2), both shorter than 128 bytes.
    if kind == "s" and n >= 4 and buf[0] == 0x0A and buf[1] < 0x80:
        k_end = 2 + buf[1]
        if (
            k_end + 2 <= n
            and buf[k_end] == 0x12
            and buf[k_end + 1] < 0x80
            and k_end + 2 + buf[k_end + 1] == n
        ):
            return _string(buf[2:k_end]), _string(buf[k_end + 2 :])
    key = ""
    value: Any = "" if kind in ("s", "Q") else None
    i = 0
    while i < n:
        tag, i = _varint(buf, i)
        if tag == 0x0A:
            raw, i = _delimited(buf, i)
            key = _string(raw)
        elif tag >> 3 == 2:
            value, i = _one(kind, tag & 7, buf, i)
        else:
            i = _skip(buf, i, tag & 7)
    return key, value


def decode_body(data: bytes) -> dict[str, Any]:
    """A protobuf response body (an object, a list, a Status) as its JSON-shaped dict; list items carry
    their ``kind`` and ``apiVersion``. :class:`DecodeError` for anything else."""
    if not data.startswith(_MAGIC):
        raise DecodeError("not a Kubernetes protobuf body (no k8s magic bytes)")
    api_version = kind = ""
    raw = b""
    i = len(_MAGIC)
    buf = data
    while i < len(buf):
        key, i = _varint(buf, i)
        if key == 0x0A:
            meta, i = _delimited(buf, i)
            for num, text in _strings(meta):
                if num == 1:
                    api_version = text
                elif num == 2:
                    kind = text
        elif key == 0x12:
            raw, i = _delimited(buf, i)
        else:
            i = _skip(buf, i, key & 7)
    if kind not in _KINDS:
        raise DecodeError(f"a protobuf body of kind {kind!r}, which the adapter does not read")
    out = _message(raw, _TABLE[kind])
    out["apiVersion"] = api_version
    out["kind"] = kind
    if kind.endswith("List"):
        for item in out.get("items", ()):
            item["apiVersion"] = api_version
            item["kind"] = kind[:-4]
    return out


def _strings(buf: bytes) -> list[tuple[int, str]]:
    out = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        if key & 7 == 2:
            raw, i = _delimited(buf, i)
            out.append((key >> 3, _string(raw)))
        else:
            i = _skip(buf, i, key & 7)
    return out


def decode_frame(frame: bytes) -> tuple[str, dict[str, Any]]:
    """One watch frame's ``metav1.WatchEvent`` (without its length prefix): its type and object."""
    etype = ""
    obj: dict[str, Any] | None = None
    i = 0
    while i < len(frame):
        key, i = _varint(frame, i)
        if key == 0x0A:
            raw, i = _delimited(frame, i)
            etype = _string(raw)
        elif key == 0x12:
            ext, i = _delimited(frame, i)
            j = 0
            while j < len(ext):
                tag, j = _varint(ext, j)
                if tag == 0x0A:
                    body, j = _delimited(ext, j)
                    obj = decode_body(body)
                else:
                    j = _skip(ext, j, tag & 7)
        else:
            i = _skip(frame, i, key & 7)
    if obj is None:
        raise DecodeError("a watch event without an object")
    return etype, obj


class Frames:
    """Splits a protobuf watch stream's bytes, as they arrive, into frames (4-byte big-endian length)."""

    MAX = 64 * 1024 * 1024  # an object of the API server is at most a few MiB (etcd's limit is 1.5 MiB)

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[bytes]:
        self._pending += data
        out = []
        while len(self._pending) >= 4:
            (n,) = struct.unpack(">I", self._pending[:4])
            if n > self.MAX:
                raise DecodeError(f"a watch frame of {n} bytes")
            if len(self._pending) < 4 + n:
                break
            out.append(self._pending[4 : 4 + n])
            self._pending = self._pending[4 + n :]
        return out

    @property
    def rest(self) -> int:
        """Bytes of an unfinished frame (the stream ended inside one)."""
        return len(self._pending)


def frames() -> Frames:
    return Frames()
