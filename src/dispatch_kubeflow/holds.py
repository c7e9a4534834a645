"""Holds on TrainJobs (SPEC §9.6), the pure part: the hold annotation, hold tokens, and the admission
check state ``dispatch-admission`` derives from them.

A hold is the annotation :data:`~dispatch_kubeflow.names.ANNOTATION_HOLD` on the TrainJob, whose value is
the hold token. Without Kueue the adapter also sets ``spec.suspend``; under Kueue, which owns
``suspend``, ``dispatch-admission`` keeps the Workload's admission check ``Pending`` while the
annotation is there (``Retry`` to evict an admitted job) and ``Ready`` once it is gone. The annotation
is the one source of truth both sides read, so a release can be checked against what the cluster
shows (the token) and fenced against a concurrent change (a JSON patch ``test`` of that very value).
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from typing import Any

from msgspec import Struct

from dispatch.model import Identity
from dispatch_kubeflow.names import ANNOTATION_HOLD
from dispatch_kubeflow.objects import as_map

__all__ = [
    "CheckState",
    "created_token",
    "desired_check",
    "held_by_us",
    "new_token",
    "pointer",
]


def held_by_us(trainjob: Mapping[str, Any]) -> str | None:
    """The hold token on ``trainjob`` if dispatch holds it (the hold annotation), else ``None``."""
    value = as_map(as_map(trainjob.get("metadata")).get("annotations")).get(ANNOTATION_HOLD)
    return value if isinstance(value, str) and value else None


def created_token(identity: Identity) -> str:
    """The token of a TrainJob created held: deterministic in the incarnation, so a dry run shows
    exactly what the submit creates. Later holds get fresh random tokens (:func:`new_token`)."""
    digest = hashlib.sha256(f"{identity.job_id}\n{identity.epoch.n}\nheld".encode()).hexdigest()
    return f"c{identity.epoch.n}-{digest[:16]}"


def new_token() -> str:
    """A fresh hold token: a later release must present exactly this value."""
    return "h-" + secrets.token_hex(8)


def pointer(key: str) -> str:
    """The JSON pointer (RFC 6901) of annotation ``key``."""
    return "/metadata/annotations/" + key.replace("~", "~0").replace("/", "~1")


class CheckState(Struct, frozen=True):
    """What ``dispatch-admission`` writes for one admission check of one Workload."""

    state: str
    message: str


def _true(obj: Mapping[str, Any], ctype: str) -> bool:
    conditions = as_map(obj.get("status")).get("conditions")
    return any(
        as_map(c).get("type") == ctype and as_map(c).get("status") == "True"
        for c in (conditions if isinstance(conditions, list) else [])
    )


def desired_check(
    workload: Mapping[str, Any], current: Mapping[str, Any], trainjob: Mapping[str, Any] | None
) -> CheckState | None:
    """The state the admission check ``current`` (an entry of the Workload's
    ``status.admissionChecks``) should have, or ``None`` to leave it as it is.

    Held (our annotation on the owning TrainJob): ``Pending``; ``Retry`` when the Workload is admitted or
    the check already ``Ready`` (Kueue then evicts it, releasing its quota, and resets the check to
    ``Pending``); a ``Retry`` not yet acted on, and any check of a Workload being evicted, is left alone
    so the eviction goes through. Not held
    (including a Workload whose owner is not a TrainJob): ``Ready``."""
    state = current.get("state")
    if state == "Rejected":
        return None  # never ours to write; leave a rejection to whoever wrote it
    if _true(workload, "Evicted"):
        # Kueue is evicting it and resets every check to Pending once the job has stopped: writing now
        # would race that reset (a Retry seen again after it would evict the job a second time).
        return None
    if trainjob is not None and held_by_us(trainjob) is not None:
        meta = as_map(trainjob.get("metadata"))
        where = f"TrainJob {meta.get('namespace', '')}/{meta.get('name', '')}"
        if state == "Retry":
            return None
        if state == "Ready" or _true(workload, "Admitted"):
            return CheckState("Retry", f"held by dispatch ({ANNOTATION_HOLD} on {where}): evicting")
        return CheckState("Pending", f"held by dispatch ({ANNOTATION_HOLD} on {where})")
    return CheckState("Ready", "not held by dispatch")
