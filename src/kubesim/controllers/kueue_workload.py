"""What Kueue's job reconciler/workload controller (``kueue.py``) and its scheduler (``kueue_scheduler.py``)
share about Workloads: names, labels, queue keys and small readings of a Workload's status. Pure; it
imports neither, so neither imports the other's private names.
"""

from __future__ import annotations

import hashlib
from typing import Any

from kubesim.controllers import conditions as cond
from kubesim.controllers.base import Key

__all__ = [
    "JOB_UID_LABEL",
    "QUEUES",
    "SCHEDULE",
    "clear_requeue_at",
    "format_amount",
    "is_finished",
    "quota_reserved",
    "workload_name",
]

JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
#: the Kueue controller's queue keys for a scheduling pass and for the queues' status
SCHEDULE: Key = ("", "*schedule*")
QUEUES: Key = ("", "*queues*")


def workload_name(trainjob_name: str, uid: str) -> str:
    """Kueue's Workload name for a TrainJob: ``trainjob-<name>`` (≤ 247 chars) + ``-`` + 5 hex of a sha1."""
    h = hashlib.sha1()
    for part in ("TrainJob", "trainer.kubeflow.org", trainjob_name):
        h.update(part.encode())
        h.update(b"\n")
    h.update(uid.encode())
    prefix = f"trainjob-{trainjob_name}"[: 253 - 1 - 5]
    return f"{prefix}-{h.hexdigest()[:5]}"


def format_amount(resource: str, value: float) -> str:
    """A quantity as Kubernetes prints it (``8``, ``500m``, ``64Gi``)."""
    if resource == "cpu":
        if abs(value - round(value)) < 1e-9:
            return str(round(value))
        return f"{round(value * 1000)}m"
    v = round(value)
    for suffix, mult in (
        ("Ei", 2**60),
        ("Pi", 2**50),
        ("Ti", 2**40),
        ("Gi", 2**30),
        ("Mi", 2**20),
        ("Ki", 2**10),
    ):
        if v >= mult and v % mult == 0:
            return f"{v // mult}{suffix}"
    return str(v)


def clear_requeue_at(status: dict[str, Any]) -> None:
    """Drop ``requeueState.requeueAt`` (and an emptied ``requeueState``)."""
    rs = status.get("requeueState")
    if isinstance(rs, dict):
        rs.pop("requeueAt", None)
        if not rs:
            del status["requeueState"]


def is_finished(obj: dict[str, Any]) -> bool:
    """The Workload (or object) has ``Finished=True``."""
    return cond.is_true(obj, "Finished")


def quota_reserved(wl: dict[str, Any]) -> bool:
    """The Workload holds quota (``QuotaReserved=True``)."""
    return cond.is_true(wl, "QuotaReserved")
