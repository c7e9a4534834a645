"""Admission for kubesim: what the CRD schemas, CEL rules and the Trainer/JobSet/Kueue webhooks enforce.

``install(store, clock, kueue=...)`` registers every hook on an ``ObjectStore``; the hooks run for API
requests and controller writes alike (including ``dryRun=All``), as real webhooks do.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from kubesim.admission.jobset import default_jobset, jobset_defaulter, jobset_pod_defaulter
from kubesim.admission.kueue import kueue_default_trainjob
from kubesim.admission.trainjob import TrainJobAdmission
from kubesim.clock import Clock
from kubesim.resources import (
    CLUSTERTRAININGRUNTIMES,
    JOBSETS,
    PODS,
    TRAININGRUNTIMES,
    TRAINJOBS,
    ResourceType,
)

if TYPE_CHECKING:
    from kubesim.store import ObjectStore

__all__ = [
    "default_jobset",
    "default_runtime",
    "install",
    "install_crds",
    "install_webhooks",
    "kueue_default_trainjob",
]


def install_crds(store: ObjectStore, clock: Clock) -> None:
    """What the API server does for the installed CRDs: the TrainJob CRD's defaults, schema and CEL
    rules, the runtime CRDs' defaults. The Simulator installs these itself, controllers or not."""
    tj = TrainJobAdmission(store.get, clock)
    store.add_admission(TRAINJOBS, tj.crd_mutate, mutating=True)
    store.add_admission(TRAINJOBS, tj.crd_validate)
    store.add_admission(TRAININGRUNTIMES, default_runtime, mutating=True)
    store.add_admission(CLUSTERTRAININGRUNTIMES, default_runtime, mutating=True)


def install_webhooks(store: ObjectStore, clock: Clock, *, kueue: bool, trainer: bool = True) -> None:
    """The admission webhooks the controllers' installs bring: Kueue's TrainJob defaulter (``kueue``),
    Trainer's defaulting and validating webhooks (``trainer``) and JobSet's defaulter. Registered after
    :func:`install_crds`, so they see CRD-defaulted objects and validate only schema-valid ones."""
    tj = TrainJobAdmission(store.get, clock)

    def mutate_trainjob(
        operation: str, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        if rt != TRAINJOBS:
            return None
        if kueue and operation == "CREATE":
            obj = kueue_default_trainjob(obj)
        out = tj.webhook_mutate(operation, rt, obj, old) if trainer else None
        return out if out is not None else obj

    store.add_admission(TRAINJOBS, mutate_trainjob, mutating=True)
    if trainer:
        store.add_admission(TRAINJOBS, tj.webhook_validate)
    store.add_admission(JOBSETS, jobset_defaulter, mutating=True)
    store.add_admission(PODS, jobset_pod_defaulter, mutating=True)


def install(store: ObjectStore, clock: Clock, *, kueue: bool, webhooks: bool = True) -> None:
    """Both halves on a store that has neither (a store used without a Simulator)."""
    install_crds(store, clock)
    install_webhooks(store, clock, kueue=kueue, trainer=webhooks)


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
