"""Kueue v0.19's TrainJob defaulting webhook (``kueue:pkg/controller/jobs/trainjob/trainjob_webhook.go``).

On create it suspends a TrainJob that names a LocalQueue (label ``kueue.x-k8s.io/queue-name``) and
appends Kueue's own, empty runtime patch (manager ``kueue.x-k8s.io/manager``), which it later fills
with the admitted flavor's node selectors.
"""

from __future__ import annotations

import copy
from typing import Any

__all__ = ["QUEUE_LABEL", "kueue_default_trainjob"]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_MANAGER = "kueue.x-k8s.io/manager"


def kueue_default_trainjob(obj: dict[str, Any]) -> dict[str, Any]:
    """Kueue's defaults for a TrainJob being created."""
    out = copy.deepcopy(obj)
    spec = out.get("spec")
    if not isinstance(spec, dict):
        return out
    metadata = out.get("metadata")
    labels = metadata.get("labels") if isinstance(metadata, dict) else None
    # A malformed labels field is refused by metadata validation after mutation.
    if isinstance(labels, dict) and labels.get(QUEUE_LABEL):
        spec["suspend"] = True
    patches = spec.get("runtimePatches")
    if patches is None or isinstance(patches, list):
        patches = list(patches or [])
        if not any(isinstance(p, dict) and p.get("manager") == KUEUE_MANAGER for p in patches):
            patches.append({"manager": KUEUE_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {}}}})
        spec["runtimePatches"] = patches
    return out
