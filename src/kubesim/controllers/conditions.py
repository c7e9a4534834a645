"""Status condition helpers with Kubernetes semantics (lastTransitionTime moves only on a status change)."""

from __future__ import annotations

from typing import Any

__all__ = ["find", "is_true", "remove", "set_condition"]


def find(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    """The condition of type ``ctype`` in ``obj.status.conditions``, or None."""
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == ctype:
            return dict(c)
    return None


def is_true(obj: dict[str, Any], ctype: str) -> bool:
    c = find(obj, ctype)
    return c is not None and c.get("status") == "True"


def set_condition(
    obj: dict[str, Any],
    ctype: str,
    status: str,
    reason: str,
    message: str,
    now: str,
    *,
    probe_time: bool = False,
    observed_generation: bool = False,
) -> bool:
    """Upsert a condition as apimachinery's ``meta.SetStatusCondition`` does; True if it changed.

    ``probe_time`` adds ``lastProbeTime`` (pod and Job conditions have it, CRD conditions do not);
    ``observed_generation`` stamps ``observedGeneration`` from the object's metadata.generation.
    """
    status_obj = obj.setdefault("status", {})
    conds: list[dict[str, Any]] = status_obj.setdefault("conditions", [])
    for c in conds:
        if c.get("type") != ctype:
            continue
        changed = False
        if c.get("status") != status:
            c["status"] = status
            c["lastTransitionTime"] = now
            if probe_time:
                c["lastProbeTime"] = now
            changed = True
        if c.get("reason") != reason or c.get("message") != message:
            c["reason"] = reason
            c["message"] = message
            if probe_time:
                c["lastProbeTime"] = now
            changed = True
        if observed_generation:
            gen = obj.get("metadata", {}).get("generation")
            if gen is not None and c.get("observedGeneration") != gen:
                c["observedGeneration"] = gen
                changed = True
        return changed
    new: dict[str, Any] = {"type": ctype, "status": status}
    if probe_time:
        new["lastProbeTime"] = now
    new["lastTransitionTime"] = now
    new["reason"] = reason
    new["message"] = message
    if observed_generation and obj.get("metadata", {}).get("generation") is not None:
        new["observedGeneration"] = obj["metadata"]["generation"]
    conds.append(new)
    return True


def remove(obj: dict[str, Any], ctype: str) -> bool:
    """Drop the condition of type ``ctype``; True if there was one."""
    conds = (obj.get("status") or {}).get("conditions")
    if not conds:
        return False
    kept = [c for c in conds if c.get("type") != ctype]
    if len(kept) == len(conds):
        return False
    obj["status"]["conditions"] = kept
    return True


def set_pod_condition(
    obj: dict[str, Any], ctype: str, status: str, reason: str, message: str, now: str
) -> bool:
    """A pod condition (``lastProbeTime: null``; reason/message omitted when empty); True if changed."""
    changed = set_condition(obj, ctype, status, reason, message, now)
    for c in obj["status"]["conditions"]:
        if c.get("type") == ctype:
            if "lastProbeTime" not in c:
                c["lastProbeTime"] = None
                changed = True
            for k in ("reason", "message"):
                if c.get(k) == "":
                    del c[k]
    return changed
