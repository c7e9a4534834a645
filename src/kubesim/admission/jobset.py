"""JobSet v0.12 defaulting webhook (``jobset:pkg/webhooks/jobset_webhook.go``), applied on create and update.

Defaults: ``replicatedJobs[].groupName: default``, ``replicas: 1``, Job ``completionMode: Indexed``,
pod ``restartPolicy: OnFailure`` if unset, ``network.enableDNSHostnames: true``,
``network.publishNotReadyAddresses: true``, ``successPolicy: {operator: All}``,
``startupPolicy: {startupPolicyOrder: AnyOrder}``.
"""

from __future__ import annotations

import copy
from typing import Any

from kubesim.errors import Cause, invalid
from kubesim.jsontypes import (
    BOOLEAN,
    INTEGER,
    STRING,
    array_of,
    object_of,
    prune_nulls,
    type_causes,
)
from kubesim.resources import JOBSETS, PODS, ResourceType
from kubesim.shapes import REPLICATED_JOBS

__all__ = ["default_jobset", "jobset_defaulter", "jobset_pod_defaulter", "jobset_type_causes"]

JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
PRIORITY_LABEL = "jobset.sigs.k8s.io/priority"

# The JSON types of the fields the defaulter and the JobSet controller read.
_SPEC = object_of(
    replicatedJobs=REPLICATED_JOBS,
    network=object_of(enableDNSHostnames=BOOLEAN, subdomain=STRING, publishNotReadyAddresses=BOOLEAN),
    successPolicy=object_of(operator=STRING, targetReplicatedJobs=array_of(STRING)),
    failurePolicy=object_of(
        maxRestarts=INTEGER,
        restartStrategy=STRING,
        rules=array_of(
            object_of(
                name=STRING,
                action=STRING,
                onJobFailureReasons=array_of(STRING),
                onJobFailureMessagePatterns=array_of(STRING),
                targetReplicatedJobs=array_of(STRING),
            )
        ),
    ),
    startupPolicy=object_of(startupPolicyOrder=STRING),
    suspend=BOOLEAN,
)


def jobset_type_causes(obj: dict[str, Any]) -> list[Cause]:
    """Wrong JSON types in the JobSet fields kubesim reads, worded as the CRD schema validator words them."""
    causes = type_causes(obj.get("spec"), _SPEC, "spec")
    spec = obj.get("spec")
    rjobs = spec.get("replicatedJobs") if isinstance(spec, dict) else None
    if not causes and isinstance(rjobs, list):
        for i, rjob in enumerate(rjobs):
            if not rjob.get("name"):
                causes.append(Cause.required(f"spec.replicatedJobs[{i}].name"))
    return causes


def default_jobset(obj: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` with the JobSet webhook's and CRD schema's defaults filled in."""
    out = copy.deepcopy(obj)
    spec = out.setdefault("spec", {})
    for rjob in spec.get("replicatedJobs") or []:
        rjob.setdefault("groupName", "default")
        rjob.setdefault("replicas", 1)
        job_spec = rjob.setdefault("template", {}).setdefault("spec", {})
        job_spec.setdefault("completionMode", "Indexed")
        pod_spec = job_spec.setdefault("template", {}).setdefault("spec", {})
        if not pod_spec.get("restartPolicy"):
            pod_spec["restartPolicy"] = "OnFailure"
    network = spec.setdefault("network", {})
    network.setdefault("enableDNSHostnames", True)
    network.setdefault("publishNotReadyAddresses", True)
    spec.setdefault("successPolicy", {"operator": "All"})
    spec["successPolicy"].setdefault("operator", "All")
    spec.setdefault("startupPolicy", {"startupPolicyOrder": "AnyOrder"})
    for i, rule in enumerate((spec.get("failurePolicy") or {}).get("rules") or []):
        if not rule.get("name"):
            rule["name"] = f"failurePolicyRule{i}"
    return out


def jobset_defaulter(
    operation: str, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
) -> dict[str, Any] | None:
    """Mutating hook: default JobSets on create and update (the defaults are idempotent)."""
    if rt != JOBSETS or operation not in ("CREATE", "UPDATE"):
        return None
    obj = {k: v for k, v in obj.items() if k != "spec"} | (
        {"spec": prune_nulls(obj["spec"])} if obj.get("spec") is not None else {}
    )
    # Refuse wrong types before defaulting walks them (the real webhook cannot even decode such a body).
    causes = jobset_type_causes(obj)
    if causes:
        meta = obj.get("metadata")
        raise invalid(JOBSETS, str((meta if isinstance(meta, dict) else {}).get("name") or ""), causes)
    return default_jobset(obj)


def jobset_pod_defaulter(
    operation: str, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
) -> dict[str, Any] | None:
    """JobSet's pod mutating webhook (``pkg/webhooks/pod_mutating_webhook.go``): a pod of a JobSet
    (annotation ``jobset-name``) is labelled ``jobset.sigs.k8s.io/priority`` with its priority. Webhooks
    run after the built-in ``Priority`` admission plugin, so a pod without a priority class has 0."""
    if rt != PODS or operation != "CREATE":
        return None
    meta = obj.get("metadata") or {}
    if not (meta.get("annotations") or {}).get(JOBSET_NAME):
        return None
    spec = obj.get("spec") or {}
    priority = spec.get("priority")
    if priority is None and not spec.get("priorityClassName"):
        priority = 0
    if priority is None:
        return None
    out = copy.deepcopy(obj)
    out["metadata"].setdefault("labels", {})[PRIORITY_LABEL] = str(priority)
    return out
