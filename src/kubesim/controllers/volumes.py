"""PersistentVolumeClaims: the PV controller with a dynamic provisioner, and what the scheduler and the
kubelet make of a pod's claims.

- A claim without ``storageClassName`` gets the default StorageClass (the ``DefaultStorageClass``
  admission plugin; the class annotated ``storageclass.kubernetes.io/is-default-class: "true"``).
- ``volumeBindingMode: Immediate``: the claim is provisioned at once: a PersistentVolume ``pvc-<claim
  uid>`` with the requested capacity, ``claimRef``, reclaim policy of the class, ``Bound``; the claim gets
  ``spec.volumeName``, ``status.phase: Bound``, capacity, access modes and the PV controller's
  annotations (``pv.kubernetes.io/bind-completed``, ``bound-by-controller``, ``volume.kubernetes.io/
  storage-provisioner``). Events ``ExternalProvisioning`` (PV controller), ``Provisioning`` and
  ``ProvisioningSucceeded`` (the provisioner).
- ``WaitForFirstConsumer``: the claim stays ``Pending`` (Event ``WaitForFirstConsumer`` "waiting for first
  consumer to be created before binding") until the scheduler picks a node for a pod using it and writes
  ``volume.kubernetes.io/selected-node``; then it is provisioned as above.
- A claim whose class does not exist, or without a class when there is no default, stays ``Pending``
  (Warning ``ProvisioningFailed`` ``storageclass.storage.k8s.io "x" not found`` / ``FailedBinding`` "no
  persistent volumes available for this claim and no storage class is set").
- Deleting a claim deletes its PV (reclaim policy ``Delete``) or releases it (``Retain``: ``Released``).

Pure decisions (:func:`scheduling_problem`, :func:`mount_problem`) are used by the scheduler and kubelet.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from kubesim.controllers.base import BaseController, Key
from kubesim.errors import ApiError
from kubesim.resources import PERSISTENTVOLUMECLAIMS, PERSISTENTVOLUMES, STORAGECLASSES

if TYPE_CHECKING:
    from kubesim.store import WatchEvent

__all__ = [
    "DEFAULT_CLASS_ANNOTATION",
    "SELECTED_NODE",
    "PersistentVolumeController",
    "claim_names",
    "default_storage_class",
    "mount_problem",
    "scheduling_problem",
]

DEFAULT_CLASS_ANNOTATION = "storageclass.kubernetes.io/is-default-class"
SELECTED_NODE = "volume.kubernetes.io/selected-node"
_PROVISIONER_ANNOTATIONS = (
    "volume.beta.kubernetes.io/storage-provisioner",
    "volume.kubernetes.io/storage-provisioner",
)

Lookup = Callable[[str], dict[str, Any] | None]


def claim_names(pod: dict[str, Any]) -> list[str]:
    """The claims a pod's volumes name, in order."""
    out = []
    for v in (pod.get("spec") or {}).get("volumes") or []:
        claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
        if claim:
            out.append(str(claim))
    return out


def default_storage_class(classes: Iterable[dict[str, Any]]) -> str | None:
    """The default class's name (the newest one when several are marked, as the admission plugin picks)."""
    marked = [
        c for c in classes if (c["metadata"].get("annotations") or {}).get(DEFAULT_CLASS_ANNOTATION) == "true"
    ]
    if not marked:
        return None
    marked.sort(key=lambda c: (c["metadata"].get("creationTimestamp", ""), c["metadata"]["name"]))
    return str(marked[-1]["metadata"]["name"])


def scheduling_problem(pod: dict[str, Any], claim: Lookup, storage_class: Lookup) -> str | None:
    """Why the scheduler's VolumeBinding plugin refuses the pod on every node (its PreFilter), or None."""
    for name in claim_names(pod):
        pvc = claim(name)
        if pvc is None:
            return f'persistentvolumeclaim "{name}" not found'
        if pvc["metadata"].get("deletionTimestamp"):
            return f'persistentvolumeclaim "{name}" is being deleted'
        if (pvc.get("status") or {}).get("phase") == "Bound":
            continue
        cls = storage_class(str((pvc.get("spec") or {}).get("storageClassName") or ""))
        if cls is None or cls.get("volumeBindingMode", "Immediate") != "WaitForFirstConsumer":
            return "pod has unbound immediate PersistentVolumeClaims"
    return None


def mount_problem(pod: dict[str, Any], claim: Lookup) -> str | None:
    """Why the kubelet cannot mount the pod's volumes yet (the pod waits ``ContainerCreating``), or None:
    the volume manager's ``error processing PVC ns/x: ...``."""
    ns = pod["metadata"].get("namespace", "")
    for name in claim_names(pod):
        pvc = claim(name)
        if pvc is None:
            return (
                f"error processing PVC {ns}/{name}: failed to fetch PVC from API server: "
                f'persistentvolumeclaims "{name}" not found'
            )
        phase = (pvc.get("status") or {}).get("phase", "")
        volume = (pvc.get("spec") or {}).get("volumeName", "")
        if phase != "Bound" or not volume:
            return (
                f"error processing PVC {ns}/{name}: PVC {ns}/{name} has non-bound phase "
                f'("{phase}") or empty pvc.Spec.VolumeName ("{volume}")'
            )
    return None


class PersistentVolumeController(BaseController):
    """Binds claims to volumes a provisioner creates for them (see the module doc)."""

    name = "persistentvolume-binder"

    def setup(self) -> None:
        self.store.add_admission(PERSISTENTVOLUMECLAIMS, self._default_class, mutating=True)

    def resync(self) -> None:
        for pvc in self.store.list(PERSISTENTVOLUMECLAIMS)[0]:
            self.enqueue(pvc["metadata"].get("namespace"), pvc["metadata"]["name"])

    def keys_for(self, ev: WatchEvent) -> Iterable[Key]:
        if ev.rt == PERSISTENTVOLUMECLAIMS:
            yield (ev.obj["metadata"].get("namespace", ""), ev.obj["metadata"]["name"])
        elif ev.rt == STORAGECLASSES:
            for pvc in self.store.list(PERSISTENTVOLUMECLAIMS)[0]:
                if (pvc.get("status") or {}).get("phase") != "Bound":
                    yield (pvc["metadata"].get("namespace", ""), pvc["metadata"]["name"])

    def _default_class(
        self, operation: str, rt: Any, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        """The DefaultStorageClass admission plugin (on create only, when no class is named)."""
        if operation != "CREATE" or (obj.get("spec") or {}).get("storageClassName") is not None:
            return None
        name = default_storage_class(self.store.list(STORAGECLASSES)[0])
        if name is None:
            return None
        out = copy.deepcopy(obj)
        out.setdefault("spec", {})["storageClassName"] = name
        return out

    def reconcile(self, namespace: str, name: str) -> None:
        pvc = self.get_or_none(PERSISTENTVOLUMECLAIMS, namespace, name)
        if pvc is None:
            self._reclaim(namespace, name)
            return
        if (pvc.get("status") or {}).get("phase") == "Bound" or pvc["metadata"].get("deletionTimestamp"):
            return
        class_name = (pvc.get("spec") or {}).get("storageClassName")
        if not class_name:
            self._once(
                pvc,
                "Normal",
                "FailedBinding",
                "no persistent volumes available for this claim and no storage class is set",
            )
            return
        cls = self.get_or_none(STORAGECLASSES, None, str(class_name))
        if cls is None:
            self._once(
                pvc, "Warning", "ProvisioningFailed", f'storageclass.storage.k8s.io "{class_name}" not found'
            )
            return
        annotations = pvc["metadata"].get("annotations") or {}
        if cls.get("volumeBindingMode") == "WaitForFirstConsumer" and SELECTED_NODE not in annotations:
            self._once(
                pvc,
                "Normal",
                "WaitForFirstConsumer",
                "waiting for first consumer to be created before binding",
            )
            return
        self._provision(pvc, cls)

    def _host_path(self, pv_name: str) -> str:
        """Where the provisioner keeps a volume's files: in the processes mode a real directory of this
        machine (the kubelet maps the volume's mounts to it), else a path nothing reads."""
        mode = getattr(self.sim, "processes", None)
        if mode is not None:
            return str(mode.volumes / pv_name)
        return f"/var/lib/kubesim/volumes/{pv_name}"

    def _once(self, pvc: dict[str, Any], etype: str, reason: str, message: str) -> None:
        # The PV controller re-records on each sync; the recorder's correlation turns repeats into counts.
        self.record_event(pvc, etype, reason, message)

    def _provision(self, pvc: dict[str, Any], cls: dict[str, Any]) -> None:
        meta = pvc["metadata"]
        ns, name = meta.get("namespace", ""), meta["name"]
        provisioner = str(cls.get("provisioner") or "")
        spec = pvc.get("spec") or {}
        size = ((spec.get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
        modes = list(spec.get("accessModes") or ["ReadWriteOnce"])
        self.record_event(
            pvc,
            "Normal",
            "ExternalProvisioning",
            f"Waiting for a volume to be created either by the external provisioner '{provisioner}' or "
            "manually by the system administrator. If volume creation is delayed, please verify that the "
            "provisioner is running and correctly registered.",
        )
        self.record_event(
            pvc,
            "Normal",
            "Provisioning",
            f'External provisioner is provisioning volume for claim "{ns}/{name}"',
            component=provisioner,
        )
        pv_name = f"pvc-{meta['uid']}"
        pv: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": pv_name,
                "annotations": {"pv.kubernetes.io/provisioned-by": provisioner},
                "finalizers": ["kubernetes.io/pv-protection"],
            },
            "spec": {
                "capacity": {"storage": size},
                "accessModes": modes,
                "persistentVolumeReclaimPolicy": cls.get("reclaimPolicy") or "Delete",
                "storageClassName": cls["metadata"]["name"],
                "volumeMode": spec.get("volumeMode") or "Filesystem",
                "hostPath": {"path": self._host_path(pv_name), "type": ""},
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": ns,
                    "name": name,
                    "uid": meta["uid"],
                    "resourceVersion": meta.get("resourceVersion"),
                },
            },
        }
        selected = (meta.get("annotations") or {}).get(SELECTED_NODE)
        if selected:
            pv["spec"]["nodeAffinity"] = {
                "required": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": [selected]}
                            ]
                        }
                    ]
                }
            }
        if self.get_or_none(PERSISTENTVOLUMES, None, pv_name) is None:
            created = self.store.create(PERSISTENTVOLUMES, pv)
            bound = copy.deepcopy(created)
            bound["status"] = {"phase": "Bound"}
            self.write(PERSISTENTVOLUMES, created, bound)
        self.record_event(
            pvc,
            "Normal",
            "ProvisioningSucceeded",
            f"Successfully provisioned volume {pv_name}",
            component=provisioner,
        )
        after = copy.deepcopy(pvc)
        annotations = after["metadata"].setdefault("annotations", {})
        annotations.update(
            {"pv.kubernetes.io/bind-completed": "yes", "pv.kubernetes.io/bound-by-controller": "yes"}
        )
        for key in _PROVISIONER_ANNOTATIONS:
            annotations[key] = provisioner
        after["spec"]["volumeName"] = pv_name
        after["status"] = {"phase": "Bound", "accessModes": modes, "capacity": {"storage": size}}
        self.write(PERSISTENTVOLUMECLAIMS, pvc, after)

    def _reclaim(self, namespace: str, name: str) -> None:
        """A deleted claim's volume: deleted (``Delete``) or ``Released`` (``Retain``)."""
        for pv in self.store.list(PERSISTENTVOLUMES)[0]:
            ref = (pv.get("spec") or {}).get("claimRef") or {}
            if ref.get("namespace") != namespace or ref.get("name") != name:
                continue
            if pv["spec"].get("persistentVolumeReclaimPolicy") == "Retain":
                after = copy.deepcopy(pv)
                after["status"] = {"phase": "Released"}
                self.write(PERSISTENTVOLUMES, pv, after)
                continue
            try:
                self.store.delete(PERSISTENTVOLUMES, None, pv["metadata"]["name"])
                cur = self.get_or_none(PERSISTENTVOLUMES, None, pv["metadata"]["name"])
                if cur is not None:  # pv-protection: nothing uses a volume whose claim is gone
                    self.store.mutate(
                        PERSISTENTVOLUMES,
                        None,
                        cur["metadata"]["name"],
                        lambda o: o["metadata"].pop("finalizers", None),
                    )
            except ApiError as e:
                if e.code != 404:
                    raise
