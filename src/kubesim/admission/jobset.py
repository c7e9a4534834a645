"""JobSet v0.12 defaulting webhook (``jobset:pkg/webhooks/jobset_webhook.go``), applied on create and update.

Defaults: ``replicatedJobs[].groupName: default``, ``replicas: 1``, Job ``completionMode: Indexed``,
pod ``restartPolicy: OnFailure`` if unset, ``network.enableDNSHostnames: true``,
``network.publishNotReadyAddresses: true``, ``successPolicy: {operator: All}``,
``startupPolicy: {startupPolicyOrder: AnyOrder}``.
"""

from __future__ import annotations

import copy
from typing import Any

from kubesim.resources import JOBSETS, ResourceType

__all__ = ["default_jobset", "jobset_defaulter"]


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
    return default_jobset(obj)
