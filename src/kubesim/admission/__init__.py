"""Admission for kubesim: what the CRD schemas, CEL rules and the Trainer/JobSet/Kueue webhooks enforce.

``install(store, clock, kueue=...)`` registers every hook on an ``ObjectStore``; the hooks run for API
requests and controller writes alike (including ``dryRun=All``), as real webhooks do.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from kubesim.admission.jobset import default_jobset, jobset_defaulter
from kubesim.admission.kueue import kueue_default_trainjob
from kubesim.admission.trainjob import TrainJobAdmission
from kubesim.clock import Clock
from kubesim.resources import CLUSTERTRAININGRUNTIMES, JOBSETS, TRAININGRUNTIMES, TRAINJOBS, ResourceType

if TYPE_CHECKING:
    from kubesim.store import ObjectStore

__all__ = ["default_jobset", "default_runtime", "install", "kueue_default_trainjob"]


def install(store: ObjectStore, clock: Clock, *, kueue: bool, webhooks: bool = True) -> None:
    """Register the TrainJob and JobSet hooks (with Kueue's TrainJob defaulter when ``kueue``).

    ``webhooks=False`` leaves out Trainer's own webhooks (the CRD's defaults, schema and CEL stay)."""
    tj = TrainJobAdmission(store.get, clock, webhooks=webhooks)

    def mutate_trainjob(
        operation: str, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        if rt != TRAINJOBS:
            return None
        if kueue and operation == "CREATE":
            obj = kueue_default_trainjob(obj)
        out = tj.mutate(operation, rt, obj, old)
        return out if out is not None else obj

    store.add_admission(TRAINJOBS, mutate_trainjob, mutating=True)
    store.add_admission(TRAINJOBS, tj.validate)
    store.add_admission(JOBSETS, jobset_defaulter, mutating=True)
    store.add_admission(TRAININGRUNTIMES, default_runtime, mutating=True)
    store.add_admission(CLUSTERTRAININGRUNTIMES, default_runtime, mutating=True)


def default_runtime(
    operation: str, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
) -> dict[str, Any] | None:
    """The runtime CRDs' schema defaults: ``replicatedJobs[].groupName: default`` and ``replicas: 1``."""
    if operation not in ("CREATE", "UPDATE"):
        return None
    out = copy.deepcopy(obj)
    template = ((out.get("spec") or {}).get("template") or {}).get("spec") or {}
    for rjob in template.get("replicatedJobs") or []:
        if isinstance(rjob, dict):
            rjob.setdefault("groupName", "default")
            rjob.setdefault("replicas", 1)
    return out
