"""Per-kind behaviour of the store, as the apiserver's registries give each kind a REST strategy.

Upstream every kind's storage (``pkg/registry/<group>/<kind>/strategy.go``, and the generic one for
custom resources in ``apiextensions-apiserver/pkg/registry/customresource``) answers the same questions:
how names are validated, whether ``metadata.generation`` is kept, what ``PrepareForCreate`` and
``PrepareForUpdate`` reset, whether an update needs a resourceVersion, what a deletion returns and how
long it takes. ``ObjectStore`` asks ``strategy_for(rt)`` instead of branching on kinds.
"""

from __future__ import annotations

import copy
from typing import Any

from kubesim.defaults import default_job, default_pod
from kubesim.resources import (
    JOBS,
    NAMESPACES,
    NODES,
    PERSISTENTVOLUMECLAIMS,
    PERSISTENTVOLUMES,
    PODS,
    SERVICES,
    ResourceType,
)

__all__ = ["BUILTIN_GROUPS", "Strategy", "strategy_for"]

#: API groups whose kinds are built into the apiserver (everything else is a custom resource).
BUILTIN_GROUPS = frozenset(
    {
        "",
        "batch",
        "coordination.k8s.io",
        "authorization.k8s.io",
        "authentication.k8s.io",
        "events.k8s.io",
        "storage.k8s.io",
    }
)


class Strategy:
    """A built-in kind with no special rules (ConfigMap, Secret, Event, Lease, ...)."""

    #: how ``metadata.name`` is validated: ``subdomain`` (DNS-1123), ``label`` or ``dns1035``
    name_rule = "subdomain"
    #: whether the registry keeps ``metadata.generation`` (custom resources, pods and jobs do)
    tracks_generation = False
    #: built-in kinds accept a PUT without ``metadata.resourceVersion``; custom resources do not
    unconditional_update = True
    #: built-in kinds take strategic merge patches; custom resources answer 415
    strategic_merge = True
    #: a DELETE that completes at once answers the object (else a ``Status``)
    returns_deleted_object = False
    #: the propagation policy of a DELETE that names none
    default_propagation = "Background"
    #: deletion always goes through ``Terminating`` first (namespaces), even without finalizers
    always_graceful = False
    #: deletion waits for a grace period (pods), which a second delete may shorten
    graceful = False

    #: a client's ``status`` is dropped on create (kinds with a status subresource; not nodes,
    #: which register with theirs, nor namespaces, whose status the server sets)
    resets_status_on_create = True

    def prepare_for_create(self, obj: dict[str, Any], *, now: float, from_api: bool) -> None:
        """Add what the server sets on create, in place, after the client's status was dropped and the
        shapes checked. ``from_api``: the request came over HTTP (not a controller's write)."""

    def prepare_for_update(self, new: dict[str, Any], current: dict[str, Any]) -> None:
        """What an update of the main resource keeps from the stored object (beyond status)."""

    def delete_grace(self, current: dict[str, Any], requested: int | None) -> int:
        """Seconds the object stays, terminating, before it is removed (0: at once)."""
        return 0

    def deletion_pending(self, obj: dict[str, Any]) -> bool:
        """Beyond finalizers: whether a terminating object must still wait (a pod's grace period)."""
        return False

    def on_deletion_start(self, obj: dict[str, Any]) -> None:
        """What the object shows once its deletion started (in place)."""


class CustomResourceStrategy(Strategy):
    """A custom resource (``customresource.NewStrategy``)."""

    tracks_generation = True
    unconditional_update = False
    strategic_merge = False


class PodStrategy(Strategy):
    tracks_generation = True
    returns_deleted_object = True
    graceful = True

    def prepare_for_create(self, obj: dict[str, Any], *, now: float, from_api: bool) -> None:
        if from_api:
            obj["status"] = {"phase": "Pending", "qosClass": pod_qos(obj)}
        default_pod(obj, now)

    def delete_grace(self, current: dict[str, Any], requested: int | None) -> int:
        spec = current.get("spec") or {}
        grace = requested if requested is not None else int(spec.get("terminationGracePeriodSeconds", 30))
        phase = (current.get("status") or {}).get("phase")
        if not spec.get("nodeName") or phase in ("Succeeded", "Failed"):
            return 0  # never ran or already finished: nothing for a kubelet to stop
        return max(grace, 0)

    def deletion_pending(self, obj: dict[str, Any]) -> bool:
        return int(obj["metadata"].get("deletionGracePeriodSeconds", 0)) > 0


class JobStrategy(Strategy):
    tracks_generation = True
    # batch/v1 Jobs orphan their pods unless told otherwise (kubectl and controllers pass a policy)
    default_propagation = "Orphan"

    def prepare_for_create(self, obj: dict[str, Any], *, now: float, from_api: bool) -> None:
        default_job(obj)


class NamespaceStrategy(Strategy):
    name_rule = "label"
    returns_deleted_object = True
    always_graceful = True
    resets_status_on_create = False

    def prepare_for_create(self, obj: dict[str, Any], *, now: float, from_api: bool) -> None:
        obj.setdefault("spec", {})["finalizers"] = ["kubernetes"]
        obj["status"] = {"phase": "Active"}

    def prepare_for_update(self, new: dict[str, Any], current: dict[str, Any]) -> None:
        new["spec"] = copy.deepcopy(current.get("spec", {}))  # spec.finalizers: only via finalize

    def deletion_pending(self, obj: dict[str, Any]) -> bool:
        return bool((obj.get("spec") or {}).get("finalizers"))

    def on_deletion_start(self, obj: dict[str, Any]) -> None:
        obj.setdefault("status", {})["phase"] = "Terminating"


class ServiceStrategy(Strategy):
    name_rule = "dns1035"
    returns_deleted_object = True


class VolumeStrategy(Strategy):
    """PersistentVolumeClaims and PersistentVolumes: ``status.phase: Pending`` and ``spec.volumeMode:
    Filesystem`` on create (``pkg/registry/core/persistentvolume{,claim}/strategy.go``, SetDefaults)."""

    def prepare_for_create(self, obj: dict[str, Any], *, now: float, from_api: bool) -> None:
        obj.setdefault("spec", {}).setdefault("volumeMode", "Filesystem")
        obj["status"] = {"phase": "Pending"}


class NodeStrategy(Strategy):
    resets_status_on_create = False  # a node registers with its status


_STRATEGIES: dict[ResourceType, Strategy] = {
    PODS: PodStrategy(),
    JOBS: JobStrategy(),
    NAMESPACES: NamespaceStrategy(),
    SERVICES: ServiceStrategy(),
    NODES: NodeStrategy(),
    PERSISTENTVOLUMECLAIMS: VolumeStrategy(),
    PERSISTENTVOLUMES: VolumeStrategy(),
}
_BUILTIN = Strategy()
_CUSTOM = CustomResourceStrategy()


def strategy_for(rt: ResourceType) -> Strategy:
    """The strategy of a kind: its own, else the built-in or custom-resource default."""
    found = _STRATEGIES.get(rt)
    if found is not None:
        return found
    return _BUILTIN if rt.group in BUILTIN_GROUPS else _CUSTOM


def pod_qos(pod: dict[str, Any]) -> str:
    """The QoS class the pod strategy computes on create (``BestEffort``/``Burstable``/``Guaranteed``)."""
    containers = list((pod.get("spec") or {}).get("containers") or [])
    containers += list((pod.get("spec") or {}).get("initContainers") or [])
    any_set = False
    guaranteed = bool(containers)
    for c in containers:
        res = c.get("resources") or {} if isinstance(c, dict) else {}
        req, lim = res.get("requests") or {}, res.get("limits") or {}
        if req or lim:
            any_set = True
        for r in ("cpu", "memory"):
            if r not in lim or (r in req and req[r] != lim[r]):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed else "Burstable"
