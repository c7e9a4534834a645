"""A Kueue v0.19 stand-in for TrainJobs: Workloads, quota, admission checks, preemption, eviction.

Per TrainJob with label ``kueue.x-k8s.io/queue-name`` (the job reconciler): a Workload
``trainjob-<name>-<hash5>`` owned by it; on admission Kueue's runtime patch gets the flavor's node
labels/tolerations and the TrainJob is unsuspended; on eviction the TrainJob is suspended, and once its
jobs are inactive the patch is cleared and the Workload requeued; ``Finished`` follows the TrainJob.
One scheduling pass (BestEffortFIFO by priority, then age) reserves quota in ClusterQueues
(``nominalQuota`` per flavor and resource), preempts lower-priority workloads under
``withinClusterQueue: LowerPriority``, and explains ``QuotaReserved=False`` (``WaitingForQuota``,
``ExceedsMaxQuota``, ``NoMatchingFlavor``, ``Misconfigured``, ``Suspended``). Admission checks listed by
the ClusterQueue must be ``Ready`` before ``Admitted``; ``Retry`` evicts and requeues; ``Rejected``
deactivates. ``maximumExecutionTimeSeconds`` deactivates with ``MaximumExecutionTimeExceeded``; a lost
node under an admitted workload evicts it with ``NodeFailures``.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kubesim.clock import parse_rfc3339, rfc3339
from kubesim.controllers import conditions as cond
from kubesim.controllers.base import BaseController, Key, controller_of
from kubesim.controllers.trainjob_build import KUEUE_MANAGER, BuildError, build_jobset
from kubesim.errors import ApiError
from kubesim.resources import (
    ADMISSIONCHECKS,
    CLUSTERQUEUES,
    CLUSTERTRAININGRUNTIMES,
    JOBSETS,
    LOCALQUEUES,
    NODES,
    PODS,
    RESOURCEFLAVORS,
    TRAININGRUNTIMES,
    TRAINJOBS,
    WORKLOADPRIORITYCLASSES,
    WORKLOADS,
)

if TYPE_CHECKING:
    from kubesim.store import WatchEvent

__all__ = ["KueueController", "format_amount", "workload_name"]

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
MAX_EXEC_LABEL = "kueue.x-k8s.io/max-exec-time-seconds"
JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
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


def _clear_requeue_at(status: dict[str, Any]) -> None:
    """Drop ``requeueState.requeueAt`` (and an emptied ``requeueState``)."""
    rs = status.get("requeueState")
    if isinstance(rs, dict):
        rs.pop("requeueAt", None)
        if not rs:
            del status["requeueState"]


def _is_finished(obj: dict[str, Any]) -> bool:
    return cond.is_true(obj, "Finished")


def _quota_reserved(wl: dict[str, Any]) -> bool:
    return cond.is_true(wl, "QuotaReserved")


class KueueController(BaseController):
    """Kueue's job reconciler and workload controller for TrainJobs; quota reservation and preemption
    are the ``scheduler`` (``kueue_scheduler.QuotaScheduler``), run on this controller's queue."""

    name = "kueue"
    cached_kinds = (WORKLOADS, CLUSTERQUEUES, LOCALQUEUES, RESOURCEFLAVORS, ADMISSIONCHECKS)

    def __init__(self, *, unadmitted_observability: bool = True) -> None:
        """``unadmitted_observability``: Kueue's ``UnadmittedWorkloadsObservability`` gate (beta in v0.19,
        off by default upstream). On, ``QuotaReserved=False`` carries granular reasons (``WaitingForQuota``,
        ``ExceedsMaxQuota``, ...) and ``Admitted=False`` is set before admission; off, the reasons are
        ``Pending``/``Inadmissible`` (the detail stays in the message) and ``Admitted`` appears only once
        admitted."""
        super().__init__()
        self.granular = unadmitted_observability
        self._waiting: set[Key] = set()  # Workloads without quota (the scheduler's queue)
        # Waiting Workloads that did not fit; retried only once quota may have been freed (as Kueue
        # parks inadmissible workloads until the ClusterQueue changes).
        self._inadmissible: set[Key] = set()
        self._usage_of: dict[Key, tuple[str, str, list[tuple[str, str, float]]]] = {}
        from kubesim.controllers.kueue_scheduler import QuotaScheduler  # (it imports this module)

        self.scheduler = QuotaScheduler(self)

    def attach(self, sim: Any) -> None:
        if not bool(getattr(sim, "kueue", True)):
            self.sim = sim
            return  # Kueue is not installed on this cluster
        super().attach(sim)

    def resync(self) -> None:
        for wl in self.cached(WORKLOADS):
            if not _quota_reserved(wl) and not _is_finished(wl):
                self._waiting.add((wl["metadata"].get("namespace", ""), wl["metadata"]["name"]))
        for tj in self.store.list(TRAINJOBS)[0]:
            self.enqueue(tj["metadata"].get("namespace"), tj["metadata"]["name"])
        self._queue[SCHEDULE] = None
        self._queue[QUEUES] = None

    def keys_for(self, ev: WatchEvent) -> Iterable[Key]:
        if ev.rt == WORKLOADS:
            # Track which Workloads wait for quota, so a scheduling pass with nothing to do is cheap.
            wkey = (ev.obj["metadata"].get("namespace", ""), ev.obj["metadata"]["name"])
            if (
                ev.type != "DELETED"
                and not _quota_reserved(ev.obj)
                and not _is_finished(ev.obj)
                and (ev.obj.get("spec") or {}).get("active", True)
            ):
                self._waiting.add(wkey)
            else:
                self._waiting.discard(wkey)
            if ev.type == "DELETED":
                self._inadmissible.discard(wkey)
                self._usage_of.pop(wkey, None)
            if self._frees_quota(ev):
                self._inadmissible.clear()
        elif ev.rt in (CLUSTERQUEUES, LOCALQUEUES, RESOURCEFLAVORS, ADMISSIONCHECKS, WORKLOADPRIORITYCLASSES):
            self._inadmissible.clear()
        if ev.rt == TRAINJOBS:
            yield (ev.obj["metadata"].get("namespace", ""), ev.obj["metadata"]["name"])
        elif ev.rt == WORKLOADS:
            ns = ev.obj["metadata"].get("namespace", "")
            ref = controller_of(ev.obj)
            if ref is not None and ref.get("kind") == "TrainJob":
                yield (ns, str(ref.get("name")))
            if ev.type != "DELETED":
                yield (f"wl:{ns}", ev.obj["metadata"]["name"])
            if self._affects_scheduling(ev):
                yield SCHEDULE
        elif ev.rt in (CLUSTERQUEUES, LOCALQUEUES, RESOURCEFLAVORS, ADMISSIONCHECKS, WORKLOADPRIORITYCLASSES):
            yield SCHEDULE
            if ev.rt != WORKLOADPRIORITYCLASSES:
                yield QUEUES
        elif ev.rt == NODES:
            yield ("", f"*node*{ev.obj['metadata']['name']}")

    @staticmethod
    def _frees_quota(ev: WatchEvent) -> bool:
        """Whether a Workload change gives quota back (or changes what a waiting one asks for)."""
        old = ev.old
        if ev.type == "DELETED":
            return _quota_reserved(ev.obj) and not _is_finished(ev.obj)
        if old is None:
            return False
        was = _quota_reserved(old) and not _is_finished(old)
        now = _quota_reserved(ev.obj) and not _is_finished(ev.obj)
        return (was and not now) or (ev.obj.get("spec") or {}) != (old.get("spec") or {})

    @staticmethod
    def _affects_scheduling(ev: WatchEvent) -> bool:
        """Whether a Workload change can change who gets quota (new, quota, finished, active, priority)."""
        if ev.type != "MODIFIED" or ev.old is None:
            return True
        new, old = ev.obj, ev.old
        for ctype in ("QuotaReserved", "Finished", "Evicted"):
            a, b = cond.find(new, ctype), cond.find(old, ctype)
            if (a or {}).get("status") != (b or {}).get("status"):
                return True
        return (new.get("spec") or {}) != (old.get("spec") or {})

    def reconcile(self, namespace: str, name: str) -> None:
        if (namespace, name) == SCHEDULE:
            self.scheduler.schedule()
        elif (namespace, name) == QUEUES:
            self._queue_status()
        elif not namespace and name.startswith("*node*"):
            self._node(name[len("*node*") :])
        elif namespace.startswith("wl:"):
            self._workload(namespace[3:], name)
        else:
            self._job(namespace, name)

    # ================================================================ job reconciler (per TrainJob)

    def _workload_of(self, tj: dict[str, Any]) -> dict[str, Any] | None:
        """A private copy of the TrainJob's Workload (from the cache), or None."""
        for wl in self.cached_owned(WORKLOADS, tj["metadata"]["uid"]):
            return copy.deepcopy(wl)
        return None

    def _runtime(self, tj: dict[str, Any]) -> dict[str, Any] | None:
        ref = (tj.get("spec") or {}).get("runtimeRef") or {}
        if ref.get("kind") == "ClusterTrainingRuntime":
            return self.get_or_none(CLUSTERTRAININGRUNTIMES, None, str(ref.get("name")))
        return self.get_or_none(TRAININGRUNTIMES, tj["metadata"].get("namespace"), str(ref.get("name")))

    def _pod_sets(self, tj: dict[str, Any]) -> list[dict[str, Any]] | None:
        runtime = self._runtime(tj)
        if runtime is None:
            return None
        probe = copy.deepcopy(tj)
        for p in probe["spec"].get("runtimePatches") or []:
            if p.get("manager") == KUEUE_MANAGER:
                p["trainingRuntimeSpec"] = {"template": {"spec": {}}}
        try:
            js = build_jobset(probe, runtime)
        except BuildError:
            return None
        out = []
        for rjob in js["spec"].get("replicatedJobs") or []:
            job_spec = (rjob.get("template") or {}).get("spec") or {}
            count = int(rjob.get("replicas", 1)) * int(job_spec.get("parallelism") or 1)
            tmpl = copy.deepcopy(job_spec.get("template") or {})
            out.append({"name": rjob["name"], "count": count, "template": tmpl})
        return out

    def _priority(self, tj: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        pc = (tj["metadata"].get("labels") or {}).get(PRIORITY_LABEL)
        if not pc:
            return 0, None
        wpc = self.get_or_none(WORKLOADPRIORITYCLASSES, None, pc)
        value = int((wpc or {}).get("value") or 0)
        return value, {"group": "kueue.x-k8s.io", "kind": "WorkloadPriorityClass", "name": pc}

    def _job(self, namespace: str, name: str) -> None:
        tj = self.get_or_none(TRAINJOBS, namespace, name)
        if tj is None or tj["metadata"].get("deletionTimestamp"):
            return
        labels = tj["metadata"].get("labels") or {}
        queue = labels.get(QUEUE_LABEL)
        if not queue:
            return
        wl = self._workload_of(tj)
        finished = cond.is_true(tj, "Complete") or cond.is_true(tj, "Failed")
        if wl is None:
            if finished:
                return
            wl = self._create_workload(tj, str(queue))
            if wl is None:
                return
        if finished:
            self._finish(wl, tj)
            return
        if _is_finished(wl):
            return
        suspended = bool((tj.get("spec") or {}).get("suspend"))
        admitted = cond.is_true(wl, "Admitted")
        evicted = cond.is_true(wl, "Evicted")
        if admitted and not evicted:
            if suspended:
                self._start(tj, wl)
            self._pods_ready(tj, wl)
            return
        # Not admitted (or being evicted): the job must not run.
        if not suspended:
            after = copy.deepcopy(tj)
            after["spec"]["suspend"] = True
            tj = self.write(TRAINJOBS, tj, after)
            if evicted:  # the job reconciler's stopJob records why on the job
                message = str((cond.find(wl, "Evicted") or {}).get("message") or "")
                self.record_event(tj, "Normal", "Stopped", message, component="kueue-admission")
        if self._jobs_active(tj):
            return
        self._clear_patch(tj)
        if evicted and _quota_reserved(wl):
            self._requeue(wl)
        self._pods_ready(tj, wl)

    def _create_workload(self, tj: dict[str, Any], queue: str) -> dict[str, Any] | None:
        meta = tj["metadata"]
        pod_sets = self._pod_sets(tj)
        if pod_sets is None:
            return None
        priority, pc_ref = self._priority(tj)
        spec: dict[str, Any] = {"active": True, "queueName": queue, "podSets": pod_sets, "priority": priority}
        if pc_ref is not None:
            spec["priorityClassRef"] = pc_ref
        max_exec = (meta.get("labels") or {}).get(MAX_EXEC_LABEL)
        if max_exec:
            try:
                spec["maximumExecutionTimeSeconds"] = int(max_exec)
            except ValueError:
                pass
        wl: dict[str, Any] = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {
                "name": workload_name(meta["name"], meta["uid"]),
                "namespace": meta.get("namespace"),
                "labels": {JOB_UID_LABEL: meta["uid"]},
                "ownerReferences": [
                    {
                        "apiVersion": "trainer.kubeflow.org/v1alpha1",
                        "kind": "TrainJob",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": spec,
        }
        try:
            created = self.store.create(WORKLOADS, wl)
        except ApiError as e:
            if e.code == 409:
                return self.get_or_none(WORKLOADS, meta.get("namespace"), wl["metadata"]["name"])
            raise
        self.record_event(
            tj,
            "Normal",
            "CreatedWorkload",
            f"Created Workload: {meta.get('namespace')}/{created['metadata']['name']}",
            component="kueue-admission",
        )
        return created

    def _jobs_active(self, tj: dict[str, Any]) -> bool:
        """Whether the TrainJob still has active jobs. Its ``jobsStatus`` can lag the JobSet's, which
        Trainer's webhook checks before a runtime patch may change, so both are consulted."""
        if any(int(s.get("active") or 0) > 0 for s in (tj.get("status") or {}).get("jobsStatus") or []):
            return True
        js = self.get_or_none(JOBSETS, tj["metadata"].get("namespace"), tj["metadata"]["name"])
        return any(
            int(s.get("active") or 0) > 0
            for s in ((js or {}).get("status") or {}).get("replicatedJobsStatus") or []
        )

    def _kueue_patch_index(self, tj: dict[str, Any]) -> int | None:
        for i, p in enumerate((tj.get("spec") or {}).get("runtimePatches") or []):
            if p.get("manager") == KUEUE_MANAGER:
                return i
        return None

    def _clear_patch(self, tj: dict[str, Any]) -> None:
        i = self._kueue_patch_index(tj)
        if i is None:
            return
        patch = tj["spec"]["runtimePatches"][i]
        spec = ((patch.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec") or {}
        if not spec.get("replicatedJobs"):
            return
        after = copy.deepcopy(tj)
        after["spec"]["runtimePatches"][i]["trainingRuntimeSpec"]["template"]["spec"].pop(
            "replicatedJobs", None
        )
        self.write(TRAINJOBS, tj, after)

    def _start(self, tj: dict[str, Any], wl: dict[str, Any]) -> None:
        """RunWithPodSetsInfo: write the flavor's scheduling directives into Kueue's patch, then unsuspend."""
        i = self._kueue_patch_index(tj)
        after = copy.deepcopy(tj)
        if i is None:
            after["spec"].setdefault("runtimePatches", []).append(
                {"manager": KUEUE_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {}}}}
            )
            i = len(after["spec"]["runtimePatches"]) - 1
        rjob_patches = []
        checks = {c.get("name"): c for c in (wl.get("status") or {}).get("admissionChecks") or []}
        for psa in ((wl.get("status") or {}).get("admission") or {}).get("podSetAssignments") or []:
            node_selector: dict[str, str] = {}
            tolerations: list[dict[str, Any]] = []
            labels: dict[str, str] = {}
            annotations: dict[str, str] = {}
            for flavor_name in sorted(set((psa.get("flavors") or {}).values())):
                rf = self.get_or_none(RESOURCEFLAVORS, None, flavor_name) or {}
                node_selector.update((rf.get("spec") or {}).get("nodeLabels") or {})
                tolerations += list((rf.get("spec") or {}).get("tolerations") or [])
            for check in checks.values():
                for upd in check.get("podSetUpdates") or []:
                    if upd.get("name") == psa.get("name"):
                        node_selector.update(upd.get("nodeSelector") or {})
                        labels.update(upd.get("labels") or {})
                        annotations.update(upd.get("annotations") or {})
                        tolerations += list(upd.get("tolerations") or [])
            # Empty fields are omitted, as Kueue's Go types serialise them (omitempty): an empty list
            # must not replace the tolerations another patch set.
            meta = {k: v for k, v in (("labels", labels), ("annotations", annotations)) if v}
            pod_spec = {k: v for k, v in (("nodeSelector", node_selector), ("tolerations", tolerations)) if v}
            pod_tmpl: dict[str, Any] = {"metadata": meta, "spec": pod_spec}
            rjob_patches.append({"name": psa.get("name"), "template": {"spec": {"template": pod_tmpl}}})
        patch = after["spec"]["runtimePatches"][i]
        patch.setdefault("trainingRuntimeSpec", {}).setdefault("template", {}).setdefault("spec", {})
        patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"] = rjob_patches
        tj = self.write(TRAINJOBS, tj, after)
        after = copy.deepcopy(tj)
        after["spec"]["suspend"] = False
        self.write(TRAINJOBS, tj, after)
        self.record_event(
            tj,
            "Normal",
            "Started",
            f"Admitted by clusterQueue {((wl.get('status') or {}).get('admission') or {}).get('clusterQueue')}",
            component="kueue-admission",
        )

    def _pods_ready(self, tj: dict[str, Any], wl: dict[str, Any]) -> None:
        after = copy.deepcopy(wl)
        now = self.now()
        if not cond.is_true(wl, "Admitted"):
            if cond.find(wl, "PodsReady") is None and cond.find(wl, "Admitted") is None:
                return
            cond.set_condition(
                after, "PodsReady", "False", "WaitForStart", "Not all pods are ready or succeeded", now
            )
        else:
            replicas = sum(1 for _ in (wl.get("spec") or {}).get("podSets") or [])
            ready = sum(
                int(s.get("ready") or 0) + int(s.get("succeeded") or 0)
                for s in (tj.get("status") or {}).get("jobsStatus") or []
            )
            if replicas and ready >= replicas:
                prev = cond.find(wl, "PodsReady") or {}
                reason = "Recovered" if prev.get("reason") in ("WaitForRecovery", "Recovered") else "Started"
                cond.set_condition(
                    after,
                    "PodsReady",
                    "True",
                    reason,
                    "All pods reached readiness and the workload is running",
                    now,
                )
            elif cond.is_true(wl, "PodsReady"):
                cond.set_condition(
                    after,
                    "PodsReady",
                    "False",
                    "WaitForRecovery",
                    "At least one pod has failed, waiting for recovery",
                    now,
                )
            else:
                cond.set_condition(
                    after, "PodsReady", "False", "WaitForStart", "Not all pods are ready or succeeded", now
                )
        self.write(WORKLOADS, wl, after)

    def _finish(self, wl: dict[str, Any], tj: dict[str, Any]) -> None:
        if _is_finished(wl):
            return
        after = copy.deepcopy(wl)
        c = cond.find(tj, "Complete") if cond.is_true(tj, "Complete") else cond.find(tj, "Failed")
        reason = "Succeeded" if cond.is_true(tj, "Complete") else "Failed"
        cond.set_condition(
            after,
            "Finished",
            "True",
            reason,
            str((c or {}).get("message") or ""),
            self.now(),
            observed_generation=True,
        )
        self.write(WORKLOADS, wl, after)

    def _requeue(self, wl: dict[str, Any]) -> None:
        """The evicted job stopped: give the quota back and put the Workload back in its queue."""
        after = copy.deepcopy(wl)
        status = after.setdefault("status", {})
        evicted = cond.find(wl, "Evicted") or {}
        now = self.now()
        status.pop("admission", None)
        cond.set_condition(
            after,
            "QuotaReserved",
            "False",
            "Pending",
            str(evicted.get("message") or ""),
            now,
            observed_generation=True,
        )
        reason = str(evicted.get("reason") or "")
        if reason in ("Preempted", "NodeFailures"):
            cond.set_condition(
                after,
                "Requeued",
                "True",
                reason,
                str(evicted.get("message") or ""),
                now,
                observed_generation=True,
            )
        elif reason == "AdmissionCheck":
            requeue_at = (status.get("requeueState") or {}).get("requeueAt")
            if requeue_at and parse_rfc3339(requeue_at) > self.clock.now():
                # A check asked for a retry delay: wait (Requeued=False) until requeueAt.
                cond.set_condition(
                    after,
                    "Requeued",
                    "False",
                    reason,
                    str(evicted.get("message") or ""),
                    now,
                    observed_generation=True,
                )
                ns, name = wl["metadata"].get("namespace", ""), wl["metadata"]["name"]
                self.requeue_at(parse_rfc3339(requeue_at), f"wl:{ns}", name)
            else:
                _clear_requeue_at(status)
                cond.set_condition(
                    after,
                    "Requeued",
                    "True",
                    "BackoffFinished",
                    "The workload backoff was finished",
                    now,
                    observed_generation=True,
                )
        for check in status.get("admissionChecks") or []:
            if check.get("state") != "Pending":
                check["state"] = "Pending"
                check["message"] = "Reset to Pending after eviction. Previously: " + str(
                    check.get("state") or ""
                )
                check["lastTransitionTime"] = now
            check.pop("podSetUpdates", None)
        self._admitted_condition(after, now)
        self.write(WORKLOADS, wl, after)

    # ================================================================ eviction helpers

    def _evict(
        self, wl: dict[str, Any], reason: str, message: str, *, underlying: str = ""
    ) -> dict[str, Any]:
        after = copy.deepcopy(wl)
        now = self.now()
        cond.set_condition(after, "Evicted", "True", reason, message, now, observed_generation=True)
        status = after.setdefault("status", {})
        stats = status.setdefault("schedulingStats", {}).setdefault("evictions", [])
        for s in stats:
            if s.get("reason") == reason and s.get("underlyingCause", "") == underlying:
                s["count"] = int(s.get("count") or 0) + 1
                break
        else:
            stats.append({"reason": reason, "underlyingCause": underlying, "count": 1})
        out = self.write(WORKLOADS, wl, after)
        self.record_event(wl, "Normal", "EvictedDueTo" + reason, message, component="kueue-admission")
        owner = controller_of(wl)
        if owner is not None:
            self.enqueue(wl["metadata"].get("namespace"), str(owner.get("name")))
        return out

    def _node(self, node_name: str) -> None:
        node = self.get_or_none(NODES, None, node_name)
        if node is not None and cond.is_true(node, "Ready"):
            return
        pods, _ = self.store.list(PODS, field_selector=f"spec.nodeName={node_name}")
        jobsets = {
            (
                p["metadata"].get("namespace"),
                (p["metadata"].get("labels") or {}).get("jobset.sigs.k8s.io/jobset-name"),
            )
            for p in pods
        }
        for ns, js_name in jobsets:
            if not js_name:
                continue
            tj = self.get_or_none(TRAINJOBS, ns, js_name)
            if tj is None:
                continue
            wl = self._workload_of(tj)
            if (
                wl is None
                or not cond.is_true(wl, "Admitted")
                or cond.is_true(wl, "Evicted")
                or _is_finished(wl)
            ):
                continue
            self._evict(
                wl,
                "NodeFailures",
                f"Workload eviction triggered due to multiple TAS assigned node failures, including: {node_name}",
            )

    # ================================================================ scheduler and workload controller

    def _workload(self, namespace: str, name: str) -> None:
        """The workload controller's duties: admission checks, maximum execution time, deactivation."""
        wl = self.cached_get(WORKLOADS, namespace, name)
        if wl is None or _is_finished(wl):
            return
        requeued = cond.find(wl, "Requeued")
        rs = (wl.get("status") or {}).get("requeueState") or {}
        if (
            requeued is not None
            and (requeued.get("status"), requeued.get("reason")) == ("False", "AdmissionCheck")
            and (not rs.get("requeueAt") or parse_rfc3339(rs["requeueAt"]) <= self.clock.now())
        ):
            after = copy.deepcopy(wl)
            _clear_requeue_at(after["status"])
            cond.set_condition(
                after,
                "Requeued",
                "True",
                "BackoffFinished",
                "The workload backoff was finished",
                self.now(),
                observed_generation=True,
            )
            self.write(WORKLOADS, wl, after)
            return
        if not (wl.get("spec") or {}).get("active", True):
            self._deactivated(copy.deepcopy(wl))
        elif _quota_reserved(wl) and not cond.is_true(wl, "Evicted"):
            self._checks(copy.deepcopy(wl), self.clock.now())

    def _cq_problem(self, cq: dict[str, Any], flavors: dict[str, Any], checks: dict[str, Any]) -> bool:
        return self._cq_active(cq, flavors, checks)[0] != "Ready"

    def _cq_active(
        self, cq: dict[str, Any], flavors: dict[str, Any], checks: dict[str, Any]
    ) -> tuple[str, str]:
        """The ClusterQueue ``Active`` condition's reason and message, as Kueue's cache computes them."""
        reasons: list[str] = []
        messages: list[str] = []
        if (cq.get("spec") or {}).get("stopPolicy", "None") not in ("None", None):
            reasons.append("Stopped")
            messages.append("is stopped")
        missing = [
            str(f.get("name"))
            for rg in (cq.get("spec") or {}).get("resourceGroups") or []
            for f in rg.get("flavors") or []
            if f.get("name") not in flavors
        ]
        if missing:
            reasons.append("FlavorNotFound")
            messages.append(f"references missing ResourceFlavor(s): {','.join(missing)}")
        names = self._cq_checks(cq)
        absent = [n for n in names if n not in checks]
        inactive = [n for n in names if n in checks and not cond.is_true(checks[n], "Active")]
        if absent:
            reasons.append("AdmissionCheckNotFound")
            messages.append(f"references missing AdmissionCheck(s): {','.join(absent)}")
        if inactive:
            reasons.append("AdmissionCheckInactive")
            messages.append(f"references inactive AdmissionCheck(s): {','.join(inactive)}")
        if reasons:
            return reasons[0], f"Can't admit new workloads: {', '.join(messages)}."
        return "Ready", "Can admit new workloads"

    def _queue_status(self) -> None:
        """``Active`` conditions of ClusterQueues and LocalQueues."""
        flavors = {f["metadata"]["name"]: f for f in self.cached(RESOURCEFLAVORS)}
        checks = {c["metadata"]["name"]: c for c in self.cached(ADMISSIONCHECKS)}
        now = self.now()
        active: dict[str, bool] = {}
        for cq in self.cached(CLUSTERQUEUES):
            reason, message = self._cq_active(cq, flavors, checks)
            active[cq["metadata"]["name"]] = reason == "Ready"
            after = copy.deepcopy(cq)
            status = "True" if reason == "Ready" else "False"
            cond.set_condition(after, "Active", status, reason, message, now, observed_generation=True)
            self.write(CLUSTERQUEUES, cq, after)
        for lq in self.cached(LOCALQUEUES):
            after = copy.deepcopy(lq)
            spec = lq.get("spec") or {}
            cq_name = str(spec.get("clusterQueue") or "")
            if spec.get("stopPolicy", "None") not in ("None", None):
                args = ("False", "Stopped", "LocalQueue is stopped")
            elif cq_name not in active:
                args = ("False", "ClusterQueueDoesNotExist", "Can't submit new workloads to clusterQueue")
            elif not active[cq_name]:
                args = ("False", "ClusterQueueIsInactive", "Can't submit new workloads to clusterQueue")
            else:
                args = ("True", "Ready", "Can submit new workloads to localQueue")
            cond.set_condition(after, "Active", *args, now, observed_generation=True)
            self.write(LOCALQUEUES, lq, after)

    @staticmethod
    def _cq_checks(cq: dict[str, Any]) -> list[str]:
        spec = (cq or {}).get("spec") or {}
        names = [
            str(c.get("name"))
            for c in (spec.get("admissionChecksStrategy") or {}).get("admissionChecks") or []
        ]
        names += [str(c) for c in spec.get("admissionChecks") or [] if str(c) not in names]
        return names

    def _pending(self, wl: dict[str, Any], reason: str, message: str) -> None:
        if reason != "WaitingForPreemptedWorkloads":
            # A preemptor stays a candidate: every pass it holds its place until its victims are gone.
            self._inadmissible.add(self._key_of(wl))
        if not self.granular:
            reason = "Inadmissible" if reason in ("Misconfigured", "Suspended") else "Pending"
        cur = cond.find(wl, "QuotaReserved")
        if cur is not None and (cur.get("status"), cur.get("reason"), cur.get("message")) == (
            "False",
            reason,
            message,
        ):
            return
        after = copy.deepcopy(wl)
        cond.set_condition(
            after, "QuotaReserved", "False", reason, message, self.now(), observed_generation=True
        )
        self.write(WORKLOADS, wl, after)
        # The scheduler's requeue records the inadmissible message on the Workload.
        self.record_event(wl, "Warning", "Pending", message, component="kueue-admission")

    def _admitted_condition(self, wl: dict[str, Any], now: str) -> None:
        """``Admitted`` from quota reservation and admission checks (Kueue's SyncAdmittedCondition)."""
        states = (wl.get("status") or {}).get("admissionChecks") or []
        ready = all(c.get("state") == "Ready" for c in states)
        reserved = _quota_reserved(wl)
        if not self.granular and cond.find(wl, "Admitted") is None and not (reserved and ready):
            return  # without the gate the condition appears only once admitted
        if reserved and ready:
            args = ("True", "Admitted", "The workload is admitted")
        elif not reserved and not ready and not self.granular:
            args = (
                "False",
                "NoReservationUnsatisfiedChecks",
                "The workload has no reservation and not all checks ready",
            )
        elif not reserved:
            args = ("False", "NoReservation", "The workload has no reservation")
        else:
            reason = "UnsatisfiedAdmissionChecks" if self.granular else "UnsatisfiedChecks"
            args = ("False", reason, "The workload has not all checks ready")
        cond.set_condition(wl, "Admitted", *args, now, observed_generation=True)

    def _checks(self, wl: dict[str, Any], now_s: float) -> None:
        states = (wl.get("status") or {}).get("admissionChecks") or []
        rejected = [c for c in states if c.get("state") == "Rejected"]
        retry = [c for c in states if c.get("state") == "Retry"]
        if rejected:
            msg = self._checks_message(rejected, "Rejected")
            after = copy.deepcopy(wl)
            cond.set_condition(
                after,
                "DeactivationTarget",
                "True",
                "AdmissionCheck",
                msg,
                self.now(),
                observed_generation=True,
            )
            after["spec"]["active"] = False
            wl = self.write(WORKLOADS, wl, after)
            self.record_event(
                wl,
                "Warning",
                "AdmissionCheckRejected",
                f"Deactivated due to {msg}",
                component="kueue-admission",
            )
            return
        if retry:
            delay = max(int(c.get("requeueAfterSeconds") or 0) for c in retry)
            if delay > 0:
                # Kueue turns a check's requeueAfterSeconds into the Workload's requeueState.requeueAt.
                after = copy.deepcopy(wl)
                rs = after.setdefault("status", {}).setdefault("requeueState", {})
                rs["requeueAt"] = rfc3339(now_s + delay)
                wl = self.write(WORKLOADS, wl, after)
            self._evict(wl, "AdmissionCheck", "Evicted due to " + self._checks_message(retry, "Retry"))
            return
        after = copy.deepcopy(wl)
        self._admitted_condition(after, self.now())
        max_exec = (wl.get("spec") or {}).get("maximumExecutionTimeSeconds")
        adm = cond.find(after, "Admitted")
        if max_exec and adm is not None and adm.get("status") == "True":
            past = int((wl.get("status") or {}).get("accumulatedPastExecutionTimeSeconds") or 0)
            deadline = parse_rfc3339(adm["lastTransitionTime"]) + float(max_exec) - past
            if now_s >= deadline:
                cond.set_condition(
                    after,
                    "DeactivationTarget",
                    "True",
                    "MaximumExecutionTimeExceeded",
                    "exceeding the maximum execution time",
                    self.now(),
                    observed_generation=True,
                )
                after["spec"]["active"] = False
                self.record_event(
                    wl,
                    "Warning",
                    "MaximumExecutionTimeExceeded",
                    f"The maximum execution time ({max_exec}s) exceeded",
                    component="kueue-admission",
                )
            else:
                self.requeue_at(deadline, f"wl:{wl['metadata'].get('namespace', '')}", wl["metadata"]["name"])
        was_admitted = cond.is_true(wl, "Admitted")
        wl = self.write(WORKLOADS, wl, after)
        if cond.is_true(after, "Admitted") and not was_admitted:
            cq_name = ((wl.get("status") or {}).get("admission") or {}).get("clusterQueue")
            self.record_event(
                wl, "Normal", "Admitted", f"Admitted by ClusterQueue {cq_name}", component="kueue-admission"
            )
            owner = controller_of(wl)
            if owner is not None:
                self.enqueue(wl["metadata"].get("namespace"), str(owner.get("name")))

    @staticmethod
    def _checks_message(checks: list[dict[str, Any]], state: str) -> str:
        parts = []
        for c in sorted(checks, key=lambda c: str(c.get("name"))):
            parts.append(
                f'"{c.get("name")}" ({c.get("message")})' if c.get("message") else f'"{c.get("name")}"'
            )
        noun = "AdmissionChecks" if len(checks) > 1 else "AdmissionCheck"
        return f"{noun} in {state} state: {'; '.join(parts)}"

    def _deactivated(self, wl: dict[str, Any]) -> None:
        """``spec.active: false``: evict (reason ``Deactivated``) and keep the Workload out of the queue."""
        if cond.is_true(wl, "Evicted"):
            return
        dt = cond.find(wl, "DeactivationTarget")
        message = "The workload is deactivated"
        underlying = ""
        if dt is not None:
            message = f"{message} due to {dt.get('message')}"
            underlying = str(dt.get("reason") or "")
        after = copy.deepcopy(wl)
        cond.remove(after, "DeactivationTarget")
        now = self.now()
        cond.set_condition(after, "Requeued", "False", "Deactivated", message, now, observed_generation=True)
        wl = self.write(WORKLOADS, wl, after)
        self._evict(wl, "Deactivated", message, underlying=underlying)
