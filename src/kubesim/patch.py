"""Patch algorithms: JSON merge patch (RFC 7386), JSON patch (RFC 6902), strategic merge patch (for
the list fields clients patch: containers/env/volumes/... keyed by name) and a single-manager
server-side apply merge.

Pure functions on JSON-like values; they never mutate their inputs.
"""

from __future__ import annotations

from typing import Any

from kubesim.errors import ApiError, bad_request

__all__ = [
    "APPLY",
    "JSON_PATCH",
    "MERGE_PATCH",
    "STRATEGIC_MERGE_PATCH",
    "apply_merge",
    "deep_copy",
    "json_patch",
    "merge_patch",
    "strategic_merge_patch",
]

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
APPLY = "application/apply-patch+yaml"


def deep_copy(value: Any) -> Any:
    """Copy a JSON-like value (dicts, lists, scalars); much faster than ``copy.deepcopy``."""
    if isinstance(value, dict):
        return {k: deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [deep_copy(v) for v in value]
    return value


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return deep_copy(patch)
    result: dict[str, Any] = deep_copy(target) if isinstance(target, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        elif isinstance(v, dict):
            result[k] = merge_patch(result.get(k), v)
        else:
            result[k] = deep_copy(v)
    return result


# ----------------------------------------------------------------------------------------- JSON patch


def _decode_pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f"json patch: path {path!r} must start with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _resolve_parent(doc: Any, parts: list[str], path: str) -> tuple[Any, str]:
    cur = doc
    for p in parts[:-1]:
        if isinstance(cur, dict):
            if p not in cur:
                raise ApiError(422, "Invalid", f"jsonpatch: path {path!r}: missing value at {p!r}")
            cur = cur[p]
        elif isinstance(cur, list):
            idx = _index(p, len(cur), path, allow_end=False)
            cur = cur[idx]
        else:
            raise ApiError(422, "Invalid", f"jsonpatch: path {path!r}: {p!r} is not a container")
    return cur, parts[-1]


def _index(p: str, length: int, path: str, *, allow_end: bool) -> int:
    if p == "-" and allow_end:
        return length
    if not p.isdigit():
        raise ApiError(422, "Invalid", f"jsonpatch: path {path!r}: {p!r} is not an array index")
    idx = int(p)
    if idx > length or (idx == length and not allow_end):
        raise ApiError(422, "Invalid", f"jsonpatch: path {path!r}: index {idx} out of range")
    return idx


def _get(doc: Any, path: str) -> Any:
    cur = doc
    for p in _decode_pointer(path):
        if isinstance(cur, dict) and p in cur:
            cur = cur[p]
        elif isinstance(cur, list) and p.isdigit() and int(p) < len(cur):
            cur = cur[int(p)]
        else:
            raise ApiError(422, "Invalid", f"jsonpatch: path {path!r} does not exist")
    return cur


def _add(doc: Any, path: str, value: Any) -> Any:
    parts = _decode_pointer(path)
    if not parts:
        return deep_copy(value)
    parent, last = _resolve_parent(doc, parts, path)
    if isinstance(parent, dict):
        parent[last] = deep_copy(value)
    elif isinstance(parent, list):
        parent.insert(_index(last, len(parent), path, allow_end=True), deep_copy(value))
    else:
        raise ApiError(422, "Invalid", f"jsonpatch: path {path!r}: parent is not a container")
    return doc


def _remove(doc: Any, path: str) -> tuple[Any, Any]:
    parts = _decode_pointer(path)
    if not parts:
        raise ApiError(422, "Invalid", "jsonpatch: cannot remove the whole document")
    parent, last = _resolve_parent(doc, parts, path)
    if isinstance(parent, dict):
        if last not in parent:
            raise ApiError(422, "Invalid", f"jsonpatch: remove: path {path!r} does not exist")
        return doc, parent.pop(last)
    if isinstance(parent, list):
        return doc, parent.pop(_index(last, len(parent), path, allow_end=False))
    raise ApiError(422, "Invalid", f"jsonpatch: path {path!r}: parent is not a container")


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 JSON patch: add, remove, replace, move, copy, test."""
    if not isinstance(ops, list):
        raise bad_request("json patch body must be a JSON array of operations")
    doc = deep_copy(target)
    for i, op in enumerate(ops):
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"json patch operation {i} must be an object with 'op' and 'path'")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, op.get("value"))
        elif kind == "remove":
            doc, _ = _remove(doc, path)
        elif kind == "replace":
            _get(doc, path)  # must exist
            doc, _ = _remove(doc, path) if path else (doc, None)
            doc = _add(doc, path, op.get("value"))
        elif kind == "move":
            doc, value = _remove(doc, op.get("from", ""))
            doc = _add(doc, path, value)
        elif kind == "copy":
            doc = _add(doc, path, _get(doc, op.get("from", "")))
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise ApiError(
                    422, "Invalid", f"jsonpatch: test operation for path {path!r} failed, value mismatch"
                )
        else:
            raise bad_request(f"json patch operation {i}: unknown op {kind!r}")
    return doc


# ---------------------------------------------------------------------------- strategic merge patch

# Merge keys of the list fields clients patch (from the Kubernetes types' patchMergeKey tags).
_MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "conditions": "type",
    "ownerReferences": "uid",
    "hostAliases": "ip",
    "readinessGates": "conditionType",
    "resourceClaims": "name",
    "schedulingGates": "name",
    "topologySpreadConstraints": "topologyKey",
    # list-map fields of the Kueue/JobSet CRDs (x-kubernetes-list-map-keys), used by server-side apply
    "admissionChecks": "name",
    "podSets": "name",
    "podSetAssignments": "name",
    "replicatedJobs": "name",
    "replicatedJobsStatus": "name",
    "flavors": "name",
}
# Primitive lists merged as sets (patchStrategy "merge" on a []string).
_SET_LISTS = {"finalizers"}


def _merge_key_for(field: str, items: list[Any]) -> str | None:
    if field == "ports":
        # Container ports are keyed by containerPort, Service ports by port.
        if any(isinstance(i, dict) and "containerPort" in i for i in items):
            return "containerPort"
        return "port"
    return _MERGE_KEYS.get(field)


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch for the fields in ``_MERGE_KEYS`` (lists merged by key), with the
    ``$patch: delete|replace``, ``$setElementOrder/…``, ``$retainKeys`` and
    ``$deleteFromPrimitiveList/…`` directives. Other lists are replaced, as in a merge patch."""
    return _smp(target, patch)


def _smp(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return deep_copy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: deep_copy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return None
    result: dict[str, Any] = deep_copy(target) if isinstance(target, dict) else {}
    retain = patch.get("$retainKeys")
    for k, v in patch.items():
        if k in ("$patch", "$retainKeys") or k.startswith("$setElementOrder/"):
            continue
        if k.startswith("$deleteFromPrimitiveList/"):
            fld = k.split("/", 1)[1]
            if isinstance(result.get(fld), list) and isinstance(v, list):
                result[fld] = [x for x in result[fld] if x not in v]
            continue
        if v is None:
            result.pop(k, None)
        elif isinstance(v, dict):
            merged = _smp(result.get(k), v)
            if merged is None:
                result.pop(k, None)
            else:
                result[k] = merged
        elif isinstance(v, list):
            result[k] = _smp_list(k, result.get(k), v)
        else:
            result[k] = deep_copy(v)
    if isinstance(retain, list):
        for k in list(result):
            if k not in retain and k not in patch:
                result.pop(k)
    return result


def _smp_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    cur = current if isinstance(current, list) else []
    if field in _SET_LISTS:
        out = list(cur)
        for v in patch:
            if v not in out:
                out.append(deep_copy(v))
        return out
    key = _merge_key_for(field, cur + patch)
    if key is None or not all(isinstance(i, dict) for i in patch):
        # $patch: replace as a list element replaces the whole list
        return [deep_copy(i) for i in patch if not (isinstance(i, dict) and i.get("$patch") == "replace")]
    if any(isinstance(i, dict) and i.get("$patch") == "replace" for i in patch):
        return [deep_copy(i) for i in patch if i.get("$patch") != "replace"]
    out = [deep_copy(i) for i in cur]
    index = {i.get(key): n for n, i in enumerate(out) if isinstance(i, dict)}
    for item in patch:
        k = item.get(key)
        if item.get("$patch") == "delete":
            if k in index:
                out[index[k]] = None
            continue
        if k in index and out[index[k]] is not None:
            out[index[k]] = _smp(out[index[k]], item)
        else:
            index[k] = len(out)
            out.append(_smp(None, item))
    return [i for i in out if i is not None]


# ------------------------------------------------------------------------------- server-side apply


def apply_merge(live: Any, applied: Any, previous: Any | None) -> Any:
    """Server-side apply for one field manager: fields the manager applied before (``previous``) but
    omits now are removed; the applied configuration is then merged in (lists keyed like SMP)."""
    base = deep_copy(live)
    if previous is not None:
        base = _prune(base, previous, applied)
    return _smp(base, applied)


def _prune(live: Any, previous: Any, applied: Any) -> Any:
    if not isinstance(live, dict) or not isinstance(previous, dict):
        return live
    applied_d = applied if isinstance(applied, dict) else {}
    for k, pv in previous.items():
        if isinstance(pv, dict) and isinstance(live.get(k), dict):
            # maps are owned field by field: drop only the keys this manager applied and omits now
            live[k] = _prune(live[k], pv, applied_d.get(k))
            if not live[k] and k not in applied_d:
                del live[k]
        elif k not in applied_d:
            live.pop(k, None)
    return live
