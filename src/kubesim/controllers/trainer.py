"""The Trainer v2.3 TrainJob controller: TrainJob → JobSet, suspend propagation, status, deadline.

Mirrors ``kubeflow/trainer:pkg/controller/trainjob_controller.go`` and the jobset plugin: the JobSet is
(re)built only while it does not exist or either side is suspended; ``Complete``/``Failed`` and
``jobsStatus`` are copied from the JobSet; ``Suspended`` is True while suspended and becomes False
(reason ``Resumed``) after a resume; ``activeDeadlineSeconds`` counts from creation or the last resume
and ends the job ``Failed``/``DeadlineExceeded`` (the JobSet is deleted, so its pods terminate).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kubesim import admission
from kubesim.admission.jobset import default_jobset
from kubesim.admission.webhook import TRAINER_DEFAULTER, call_failed
from kubesim.clock import unstamp
from kubesim.controllers import conditions as cond
from kubesim.controllers.base import BaseController, Key, controller_of
from kubesim.controllers.trainjob_build import (
    BuildError,
    build_jobset,
    framework_of,
    is_supported,
    registry_key,
)
from kubesim.errors import ApiError, cached_not_found_message
from kubesim.resources import (
    CLUSTERTRAININGRUNTIMES,
    CONFIGMAPS,
    JOBSETS,
    SECRETS,
    TRAININGRUNTIMES,
    TRAINJOBS,
    ResourceType,
)
from kubesim.store import FOREGROUND

if TYPE_CHECKING:
    from kubesim.store import WatchEvent

__all__ = ["TrainerController", "is_finished"]

SUSPENDED_MSG = "TrainJob is suspended"
RESUMED_MSG = "TrainJob is resumed"
DEADLINE_MSG = "TrainJob exceeded its active deadline"
EXTERNAL_MANAGERS = ("kueue.x-k8s.io/multikueue",)
REAPPLY_DELAY = 1.0
"""Seconds between the garbage collector removing the JobSet of a TrainJob being deleted and Trainer
v2.3.0 applying it again (about a second on a real cluster)."""


def is_finished(tj: dict[str, Any]) -> bool:
    return cond.is_true(tj, "Complete") or cond.is_true(tj, "Failed")


def _copy_condition(obj: dict[str, Any], c: dict[str, Any]) -> None:
    """``meta.SetStatusCondition`` with a condition that carries its own transition time."""
    conds: list[dict[str, Any]] = obj.setdefault("status", {}).setdefault("conditions", [])
    for cur in conds:
        if cur.get("type") == c.get("type"):
            if cur.get("status") != c.get("status"):
                cur["status"] = c.get("status")
                cur["lastTransitionTime"] = c.get("lastTransitionTime")
            cur["reason"] = c.get("reason")
            cur["message"] = c.get("message")
            return
    conds.append(
        {
            "type": c.get("type"),
            "status": c.get("status"),
            "lastTransitionTime": c.get("lastTransitionTime"),
            "reason": c.get("reason"),
            "message": c.get("message"),
        }
    )


class TrainerController(BaseController):
    """Reconciles TrainJobs into JobSets and reports their status (also installs the webhooks)."""

    name = "trainer"

    def __init__(self, *, webhooks: bool = True) -> None:
        super().__init__()
        # webhooks=False models a cluster whose admission webhooks are not installed (CRD rules only).
        self.webhooks = webhooks
        self._reapply_at: dict[Key, float] = {}  # TrainJobs being deleted whose JobSet comes back then

    def setup(self) -> None:
        if self.webhooks:
            # Registered before the webhooks themselves: an unreachable Trainer fails the write first.
            self.store.add_admission(TRAINJOBS, self._webhooks_reachable, mutating=True)
        # The CRDs' own defaults and validation are the API server's (the Simulator installs them).
        admission.install_webhooks(
            self.store, self.clock, kueue=bool(getattr(self.sim, "kueue", False)), trainer=self.webhooks
        )
        self.store.add_foreground_hold(
            lambda owner: owner.get("kind") == "TrainJob" and self._recreates(owner)
        )

    def _webhooks_reachable(
        self, operation: str, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> None:
        """Fail a write Trainer's webhooks intercept (create and update of TrainJobs, not status) while
        ``sim.faults.webhooks_unavailable("trainer")`` holds."""
        faults = getattr(self.sim, "faults", None)
        error = faults.webhook_error("trainer") if faults is not None else None
        if error is not None and operation in ("CREATE", "UPDATE"):
            raise call_failed(TRAINER_DEFAULTER, error)

    def _recreates(self, tj: dict[str, Any]) -> bool:
        """Whether this Trainer re-applies the JobSet of ``tj`` although ``tj`` is being deleted in the
        foreground: Trainer v2.3.0 keeps reconciling a TrainJob with a deletionTimestamp, so each JobSet
        the garbage collector removes comes back and the deletion never finishes (issue 24). Off unless
        the simulator's ``recreate_jobset_while_deleting`` is set."""
        meta = tj["metadata"]
        return (
            bool(getattr(self.sim, "recreate_jobset_while_deleting", False))
            and bool(meta.get("deletionTimestamp"))
            and FOREGROUND in (meta.get("finalizers") or [])
            and not is_finished(tj)
            and (tj.get("spec") or {}).get("managedBy") not in EXTERNAL_MANAGERS
        )

    def _reapply_while_deleting(self, tj: dict[str, Any]) -> None:
        meta = tj["metadata"]
        ns, name = meta.get("namespace"), meta["name"]
        key = (ns or "", name)
        if not self._recreates(tj) or self.get_or_none(JOBSETS, ns, name) is not None:
            self._reapply_at.pop(key, None)
            return
        due = self._reapply_at.setdefault(key, self.clock.now() + REAPPLY_DELAY)
        if self.clock.now() < due:
            self.requeue_at(due, ns, name)
            return
        del self._reapply_at[key]
        try:
            self._reconcile_objects(tj)
        except (BuildError, _RuntimeMissing):
            return  # nothing to apply (the runtime is gone): the deletion can finish

    def resync(self) -> None:
        for tj in self.store.list(TRAINJOBS)[0]:
            self.enqueue(tj["metadata"].get("namespace"), tj["metadata"]["name"])

    def keys_for(self, ev: WatchEvent) -> Iterable[Key]:
        if ev.rt == TRAINJOBS:
            yield (ev.obj["metadata"].get("namespace", ""), ev.obj["metadata"]["name"])
        elif ev.rt == JOBSETS:
            ref = controller_of(ev.obj)
            if ref is not None and ref.get("kind") == "TrainJob":
                yield (ev.obj["metadata"].get("namespace", ""), str(ref.get("name")))

    # ------------------------------------------------------------------------------ reconcile

    def reconcile(self, namespace: str, name: str) -> None:
        tj = self.get_or_none(TRAINJOBS, namespace, name)
        if tj is None:
            self._reapply_at.pop((namespace, name), None)
            return
        if tj["metadata"].get("deletionTimestamp"):
            self._reapply_while_deleting(tj)
            return
        spec = tj.get("spec") or {}
        if spec.get("managedBy") in EXTERNAL_MANAGERS:
            return
        before = copy.deepcopy(tj)
        failed = cond.find(tj, "Failed")
        if failed is not None and failed.get("reason") != "DeadlineExceeded":
            cond.remove(tj, "Failed")
        if not is_supported(tj):
            msg = f"unsupported runtime: {registry_key(tj)}"
            cond.set_condition(tj, "Failed", "True", "TrainingRuntimeNotSupported", msg, self.now())
        elif not is_finished(tj):
            try:
                self._reconcile_objects(tj)
            except (BuildError, _RuntimeMissing) as e:
                text = str(e)
                message = f"TrainJob resources reconciliation failed: {text[:950]}"
                if len(text) > 950:
                    message += " ..."
                self.record_event(
                    tj, "Warning", "TrainJobResourcesCreationFailed", message, component="trainjob-controller"
                )
            except ApiError as e:
                if e.code == 409:
                    raise
                message = f"TrainJob resources reconciliation failed: {e.message[:950]}"
                self.record_event(
                    tj, "Warning", "TrainJobResourcesCreationFailed", message, component="trainjob-controller"
                )
        self._set_suspended(tj)
        self._copy_status(tj)
        self._deadline(tj)
        if tj.get("status") != before.get("status"):
            body = copy.deepcopy(before)
            body["status"] = tj.get("status") or {}
            self.store.update_status(TRAINJOBS, body)

    def _runtime(self, tj: dict[str, Any]) -> dict[str, Any]:
        ref = (tj.get("spec") or {}).get("runtimeRef") or {}
        cluster = ref.get("kind") == "ClusterTrainingRuntime"
        try:
            if cluster:
                return self.store.get(CLUSTERTRAININGRUNTIMES, None, str(ref.get("name")))
            return self.store.get(TRAININGRUNTIMES, tj["metadata"].get("namespace"), str(ref.get("name")))
        except ApiError as e:
            if e.code != 404:
                raise
            which = "not found ClusterTrainingRuntime" if cluster else "TrainingRuntime"
            suffix = "specified in TrainJob" if cluster else "specified in TrainJob is not found"
            rt = CLUSTERTRAININGRUNTIMES if cluster else TRAININGRUNTIMES
            missing = cached_not_found_message(rt, str(ref.get("name")))
            raise _RuntimeMissing(f"{which} {suffix}: {missing}") from None

    def _reconcile_objects(self, tj: dict[str, Any]) -> None:
        meta = tj["metadata"]
        runtime = self._runtime(tj)
        old = self.get_or_none(JOBSETS, meta.get("namespace"), meta["name"])
        suspended = bool((tj.get("spec") or {}).get("suspend"))
        if old is not None and not suspended and not (old.get("spec") or {}).get("suspend"):
            return  # both running: the real controller leaves a running JobSet alone
        desired = default_jobset(build_jobset(tj, runtime))
        if framework_of(runtime) == "mpi":
            self._mpi_objects(tj)
        if old is None:
            self.store.create(JOBSETS, desired)
            return
        after = copy.deepcopy(old)
        after["spec"] = desired["spec"]
        labels = dict(old["metadata"].get("labels") or {})
        labels.update(desired["metadata"].get("labels") or {})
        annotations = dict(old["metadata"].get("annotations") or {})
        annotations.update(desired["metadata"].get("annotations") or {})
        if labels:
            after["metadata"]["labels"] = labels
        if annotations:
            after["metadata"]["annotations"] = annotations
        after["metadata"]["ownerReferences"] = desired["metadata"]["ownerReferences"]
        self.write(JOBSETS, old, after)

    def _mpi_objects(self, tj: dict[str, Any]) -> None:
        meta = tj["metadata"]
        ns, name = meta.get("namespace"), meta["name"]
        owner = {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "name": name,
            "uid": meta["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
        if self.get_or_none(SECRETS, ns, f"{name}-mpi-ssh-auth") is None:
            self.store.create(
                SECRETS,
                {
                    "apiVersion": "v1",
                    "kind": "Secret",
                    "metadata": {"name": f"{name}-mpi-ssh-auth", "namespace": ns, "ownerReferences": [owner]},
                    "type": "kubernetes.io/ssh-auth",
                    "data": {"ssh-privatekey": "a3ViZXNpbQ==", "ssh-publickey": "a3ViZXNpbQ=="},
                },
            )
        if self.get_or_none(CONFIGMAPS, ns, f"{name}-mpi-hostfile") is None:
            hosts = f"{name}-node-0-0.{name}.{ns}.svc slots=1\n"
            self.store.create(
                CONFIGMAPS,
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": f"{name}-mpi-hostfile", "namespace": ns, "ownerReferences": [owner]},
                    "data": {"hostfile": hosts},
                },
            )

    def _set_suspended(self, tj: dict[str, Any]) -> None:
        now = self.now()
        if (tj.get("spec") or {}).get("suspend"):
            cond.set_condition(tj, "Suspended", "True", "Suspended", SUSPENDED_MSG, now)
        elif cond.is_true(tj, "Suspended"):
            cond.set_condition(tj, "Suspended", "False", "Resumed", RESUMED_MSG, now)

    def _copy_status(self, tj: dict[str, Any]) -> None:
        meta = tj["metadata"]
        js = self.get_or_none(JOBSETS, meta.get("namespace"), meta["name"])
        if js is None:
            return  # gone (TTL or deadline): keep what the TrainJob already says
        for js_type, tj_type in (("Completed", "Complete"), ("Failed", "Failed")):
            c = cond.find(js, js_type)
            if c is not None and c.get("status") == "True":
                c["type"] = tj_type
                _copy_condition(tj, c)
        statuses = []
        for rj in (js.get("status") or {}).get("replicatedJobsStatus") or []:
            statuses.append(
                {
                    "name": rj.get("name"),
                    "ready": int(rj.get("ready") or 0),
                    "succeeded": int(rj.get("succeeded") or 0),
                    "failed": int(rj.get("failed") or 0),
                    "active": int(rj.get("active") or 0),
                    "suspended": int(rj.get("suspended") or 0),
                }
            )
        if statuses or "jobsStatus" in (tj.get("status") or {}):
            tj.setdefault("status", {})["jobsStatus"] = statuses

    def _deadline(self, tj: dict[str, Any]) -> None:
        spec = tj.get("spec") or {}
        ads = spec.get("activeDeadlineSeconds")
        if not ads or is_finished(tj) or spec.get("suspend"):
            return
        meta = tj["metadata"]
        start = unstamp(self.clock, meta["creationTimestamp"])
        susp = cond.find(tj, "Suspended")
        if susp is not None and susp.get("status") == "False" and susp.get("lastTransitionTime"):
            start = unstamp(self.clock, susp["lastTransitionTime"])
        deadline = start + float(ads)
        now = self.clock.now()
        if now > deadline:
            cond.set_condition(tj, "Failed", "True", "DeadlineExceeded", DEADLINE_MSG, self.now())
            try:
                self.store.delete(JOBSETS, meta.get("namespace"), meta["name"])
            except ApiError as e:
                if e.code != 404:
                    raise
            return
        self.requeue_at(deadline if now < deadline else now + 1.0, meta.get("namespace"), meta["name"])


class _RuntimeMissing(Exception):
    pass
