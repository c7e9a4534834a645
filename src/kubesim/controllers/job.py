"""The batch/v1 Job controller for Indexed Jobs (the kind JobSet creates), with Kubernetes 1.31+ rules.

Pods are ``<job>-<index>-<random5>`` with the Job's labels plus ``batch.kubernetes.io/job-completion-index``
(label and annotation); a replacement for a failed or terminating pod is created at the Job's next sync
(a batch period after the pod's update, or once the pod-failure back-off has passed). Failures count
toward ``backoffLimit`` (default 6): under ``restartPolicy: OnFailure`` the container restarts of running
pods count; under ``Never`` the failed pods. ``activeDeadlineSeconds`` → ``DeadlineExceeded``. A failing
Job first gets ``FailureTarget`` and deletes its pods; ``Failed`` is added once they are gone. Suspending
deletes the active pods (not counted as failures); resuming resets ``startTime``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kubesim.clock import Clock, unstamp
from kubesim.controllers import conditions as cond
from kubesim.controllers.base import BaseController, Key, controller_of, owner_ref
from kubesim.resources import JOBS, PODS

if TYPE_CHECKING:
    from kubesim.store import WatchEvent

__all__ = ["JobController", "format_indexes", "pod_failure_action"]

INDEX_KEY = "batch.kubernetes.io/job-completion-index"
SYNC_JOB_BATCH_PERIOD = 1.0
"""Seconds after an event of one of its pods that a Job is synced (kubernetes
pkg/controller/job/job_controller.go, ``SyncJobBatchPeriod``): ``addPod``, ``updatePod`` and ``deletePod``
all enqueue the Job with ``enqueueSyncJobBatched``, so a Job reacts to a pod created, ready, ended or
deleted a second later; a Job's own creation, spec change or deletion is synced at once."""
COMPLETION_INDEX_ENV = "JOB_COMPLETION_INDEX"
_INDEX_FIELD = f"metadata.annotations['{INDEX_KEY}']"
DEFAULT_TOLERATIONS = [
    {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
    {
        "key": "node.kubernetes.io/unreachable",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    },
]


BACKOFF_BASE = 10.0  # DefaultJobPodFailureBackOff (pkg/controller/job/job_controller.go)
BACKOFF_MAX = 600.0  # MaxJobPodFailureBackOff: 10 minutes in v1.36


def pod_failure_action(policy: dict[str, Any] | None, pod: dict[str, Any]) -> tuple[str, str]:
    """The ``podFailurePolicy`` action for a failed pod (``Count`` when no rule matches) and its message."""
    meta = pod["metadata"]
    who = f"{meta.get('namespace')}/{meta['name']}"
    for i, rule in enumerate((policy or {}).get("rules") or []):
        action = str(rule.get("action"))
        on_codes = rule.get("onExitCodes")
        if on_codes:
            values = {int(v) for v in on_codes.get("values") or []}
            wanted = on_codes.get("containerName")
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                if wanted and cs.get("name") != wanted:
                    continue
                term = (cs.get("state") or {}).get("terminated")
                if not term:
                    continue
                code = int(term.get("exitCode", 0))
                if code == 0:
                    continue
                hit = code in values if on_codes.get("operator", "In") == "In" else code not in values
                if hit:
                    return action, (
                        f"Container {cs.get('name')} for pod {who} failed with exit code {code} matching {action} "
                        f"rule at index {i}"
                    )
        for pc in rule.get("onPodConditions") or []:
            c = cond.find(pod, str(pc.get("type")))
            if c is not None and c.get("status") == pc.get("status", "True"):
                return action, f"Pod {who} has condition {pc.get('type')} matching {action} rule at index {i}"
    return "Count", ""


def format_indexes(indexes: Iterable[int]) -> str:
    """``completedIndexes`` text as the Job controller writes it (``orderedIntervals.String`` in
    ``pkg/controller/job/indexed_job_utils.go``): sorted intervals, a run of three or more as ``a-b``,
    a pair as ``a,b`` (``0-2,5``, ``0,1``, ``3,4,7``)."""
    xs = sorted(set(indexes))
    parts: list[str] = []
    i = 0
    while i < len(xs):
        j = i
        while j + 1 < len(xs) and xs[j + 1] == xs[j] + 1:
            j += 1
        if i == j:
            parts.append(str(xs[i]))
        else:
            parts.append(f"{xs[i]},{xs[j]}" if j == i + 1 else f"{xs[i]}-{xs[j]}")
        i = j + 1
    return ",".join(parts)


def _set_count(status: dict[str, Any], key: str, value: int) -> None:
    """JobStatus ``active``/``succeeded``/``failed`` are plain int32 with ``omitempty``: absent when 0."""
    if value:
        status[key] = value
    else:
        status.pop(key, None)


def _is_terminal(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _finished_time(clock: Clock, pod: dict[str, Any]) -> float:
    """When a failed pod ended, in simulated time, looked up as upstream's ``getFinishedTime``
    (pkg/controller/job/backoff_utils.go): the latest ``finishedAt`` when every container terminated,
    else the ``Ready=False`` transition, else ``deletionTimestamp`` minus the grace period, else the pod's
    creation. Whole seconds, as the API writes them."""
    status = pod.get("status") or {}
    meta = pod["metadata"]
    statuses = status.get("containerStatuses") or []
    ends = [((cs.get("state") or {}).get("terminated") or {}).get("finishedAt") for cs in statuses]
    if statuses and all(ends):
        return max(unstamp(clock, str(e)) for e in ends)
    ready = cond.find(pod, "Ready")
    if ready is not None and ready.get("status") == "False" and ready.get("lastTransitionTime"):
        return unstamp(clock, str(ready["lastTransitionTime"]))
    if meta.get("deletionTimestamp"):
        grace = float(meta.get("deletionGracePeriodSeconds") or 0)
        return unstamp(clock, str(meta["deletionTimestamp"])) - grace
    return unstamp(clock, str(meta.get("creationTimestamp")))


def _index(pod: dict[str, Any]) -> int:
    try:
        return int((pod["metadata"].get("annotations") or {}).get(INDEX_KEY, "-1"))
    except ValueError:
        return -1


class JobController(BaseController):
    """Creates and counts the pods of Indexed Jobs."""

    name = "job"
    cached_kinds = (PODS,)

    def __init__(self) -> None:
        super().__init__()
        self._counted_failed: dict[str, set[str]] = {}  # job uid -> pod uids already counted as failed
        self._ignored: set[str] = set()  # pod uids deleted by us for suspension/finish (not failures)
        self._last_failure: dict[str, float] = {}  # job uid -> time of its last counted pod failure
        self._fail_job: dict[str, str] = {}  # job uid -> message of a matched FailJob rule
        # job uid -> pods removed before this controller counted them (a force delete, PodGC): what the
        # batch.kubernetes.io/job-tracking finalizer makes a real Job controller see and count.
        self._vanished: dict[str, list[dict[str, Any]]] = {}

    def resync(self) -> None:
        for job in self.store.list(JOBS)[0]:
            self.enqueue(job["metadata"].get("namespace"), job["metadata"]["name"])

    def keys_for(self, ev: WatchEvent) -> Iterable[Key]:
        if ev.type == "DELETED":
            self._forget(ev)
        if ev.rt == JOBS:
            yield (ev.obj["metadata"].get("namespace", ""), ev.obj["metadata"]["name"])
        elif ev.rt == PODS:
            ref = controller_of(ev.obj)
            if ref is None or ref.get("kind") != "Job":
                return
            # Every pod event is synced a batch period later (the earliest pending sync wins, as the
            # delaying queue keeps it): for that second a pod that failed has a Job that says nothing yet,
            # as on a real cluster — the "starting (cause)" a reader sees before "failed".
            ns, job = ev.obj["metadata"].get("namespace", ""), str(ref.get("name"))
            self.requeue_at(self.clock.now() + SYNC_JOB_BATCH_PERIOD, ns, job)

    def _forget(self, ev: WatchEvent) -> None:
        """Drop the bookkeeping of a Job or pod that is gone, so memory does not grow with every job run."""
        uid = str(ev.obj["metadata"].get("uid"))
        if ev.rt == JOBS:
            self._counted_failed.pop(uid, None)
            self._last_failure.pop(uid, None)
            self._fail_job.pop(uid, None)
            self._vanished.pop(uid, None)
        elif ev.rt == PODS:
            ref = controller_of(ev.obj)
            done = (ev.obj.get("status") or {}).get("phase") == "Succeeded"
            if (
                ref is not None
                and ref.get("kind") == "Job"
                and uid not in self._ignored
                and not done
                and self.store.exists(JOBS, ev.obj["metadata"].get("namespace"), str(ref.get("name")))
            ):
                self._vanished.setdefault(str(ref.get("uid")), []).append(ev.obj)
            self._ignored.discard(uid)

    def _pods(self, job: dict[str, Any]) -> list[dict[str, Any]]:
        """The Job's pods (read-only, from the cache)."""
        return self.cached_owned(PODS, job["metadata"]["uid"])

    def _delete_pod(self, job: dict[str, Any], pod: dict[str, Any]) -> None:
        self._ignored.add(pod["metadata"]["uid"])
        self.store.delete(PODS, pod["metadata"].get("namespace"), pod["metadata"]["name"])
        # The pod control's events (pkg/controller/controller_utils.go), then the Job controller's.
        self._event(job, True, "Normal", "SuccessfulDelete", f"Deleted pod: {pod['metadata']['name']}")

    def _event(self, job: dict[str, Any], changed: bool, etype: str, reason: str, message: str) -> None:
        """The Job controller's Event for a condition it just changed (syncJob: Suspended, Resumed,
        Completed, and the finished condition's reason and message when the Job fails)."""
        if changed:
            self.record_event(job, etype, reason, message, component="job-controller")

    def reconcile(self, namespace: str, name: str) -> None:
        job = self.get_or_none(JOBS, namespace, name)
        if job is None:
            return
        if job["metadata"].get("deletionTimestamp"):
            return
        before = copy.deepcopy(job)
        spec = job.get("spec") or {}
        status = job.setdefault("status", {})
        pods = self._pods(job)
        uid = job["metadata"]["uid"]
        counted = self._counted_failed.setdefault(uid, set())
        completions = int(spec.get("completions") or spec.get("parallelism") or 1)
        now_s = self.clock.now()
        now = self.now()

        succeeded_idx = {_index(p) for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"}
        vanished = self._vanished.pop(uid, [])
        new_failures: list[float] = []
        for p in [*pods, *vanished]:
            puid = p["metadata"]["uid"]
            phase = (p.get("status") or {}).get("phase")
            deleting = bool(p["metadata"].get("deletionTimestamp")) or any(v is p for v in vanished)
            if puid in counted or puid in self._ignored or phase == "Succeeded":
                continue
            if phase == "Failed" or deleting:
                counted.add(puid)
                action, message = pod_failure_action(spec.get("podFailurePolicy"), p)
                if action == "Ignore":
                    continue
                if action == "FailJob":
                    self._fail_job[uid] = message
                status["failed"] = int(status.get("failed") or 0) + 1
                new_failures.append(_finished_time(self.clock, p))
        if new_failures:
            # The back-off runs from when the last new failure happened, not from this (batched) sync.
            self._last_failure[uid] = max(new_failures)
        active = [p for p in pods if not _is_terminal(p) and not p["metadata"].get("deletionTimestamp")]
        terminating = [p for p in pods if not _is_terminal(p) and p["metadata"].get("deletionTimestamp")]

        finished = cond.is_true(job, "Complete") or cond.is_true(job, "Failed")
        failure_target = cond.find(job, "FailureTarget")
        if finished:
            for p in active:
                self._delete_pod(job, p)
        elif failure_target is not None and failure_target.get("status") == "True":
            for p in active:
                self._delete_pod(job, p)
            if not active and not terminating:
                r, msg = str(failure_target.get("reason")), str(failure_target.get("message"))
                changed = cond.set_condition(job, "Failed", "True", r, msg, now, probe_time=True)
                self._event(job, changed, "Warning", r, msg)
        elif spec.get("suspend"):
            for p in active:
                self._delete_pod(job, p)
            active = []
            if cond.set_condition(
                job, "Suspended", "True", "JobSuspended", "Job suspended", now, probe_time=True
            ):
                status.pop("startTime", None)
                self._event(job, True, "Normal", "Suspended", "Job suspended")
        else:
            if cond.find(job, "Suspended") is not None and cond.is_true(job, "Suspended"):
                cond.set_condition(
                    job, "Suspended", "False", "JobResumed", "Job resumed", now, probe_time=True
                )
                status["startTime"] = now
                self._event(job, True, "Normal", "Resumed", "Job resumed")
            status.setdefault("startTime", now)
            reason = self._failure_reason(job, active, now_s)
            if reason is not None:
                r, msg = reason
                cond.set_condition(job, "FailureTarget", "True", r, msg, now, probe_time=True)
                for p in active:
                    self._delete_pod(job, p)
                if not active and not terminating:
                    changed = cond.set_condition(job, "Failed", "True", r, msg, now, probe_time=True)
                    self._event(job, changed, "Warning", r, msg)
                active = []
            elif len(succeeded_idx & set(range(completions))) >= completions:
                for p in active:
                    self._delete_pod(job, p)
                cond.set_condition(
                    job,
                    "SuccessCriteriaMet",
                    "True",
                    "CompletionsReached",
                    "Reached expected number of succeeded pods",
                    now,
                    probe_time=True,
                )
                if not terminating:
                    changed = cond.set_condition(
                        job,
                        "Complete",
                        "True",
                        "CompletionsReached",
                        "Reached expected number of succeeded pods",
                        now,
                        probe_time=True,
                    )
                    status["completionTime"] = now
                    self._event(job, changed, "Normal", "Completed", "Job completed")
                active = []
            else:
                active_idx = {_index(p) for p in active}
                missing = [i for i in range(completions) if i not in succeeded_idx and i not in active_idx]
                not_before = self._replacement_time(job)
                if missing and now_s < not_before:
                    self.requeue_at(not_before, namespace, name)  # pod failure back-off
                    missing = []
                for i in missing:
                    created = self.store.create(PODS, self._pod_for(job, i))
                    active.append(created)
                    self._event(
                        job, True, "Normal", "SuccessfulCreate", f"Created pod: {created['metadata']['name']}"
                    )
                self._arm_deadline(job, now_s)

        # ready and terminating are pointers (always written); completedIndexes is an omitempty string
        _set_count(status, "active", len(active))
        status["ready"] = sum(1 for p in active if cond.is_true(p, "Ready"))
        status["terminating"] = len(terminating)
        _set_count(status, "succeeded", len(succeeded_idx & set(range(completions))))
        _set_count(status, "failed", int(status.get("failed") or 0))
        status.pop("completedIndexes", None)
        if completed := format_indexes(succeeded_idx & set(range(completions))):
            status["completedIndexes"] = completed
        status.setdefault("uncountedTerminatedPods", {})
        if job.get("status") != before.get("status"):
            body = copy.deepcopy(before)
            body["status"] = job["status"]
            self.store.update_status(JOBS, body)

    def _replacement_time(self, job: dict[str, Any]) -> float:
        """When replacements may be created: 10 s after the last failure, doubling per failure, max 10 min."""
        uid = job["metadata"]["uid"]
        failed = int((job.get("status") or {}).get("failed") or 0)
        last = self._last_failure.get(uid)
        if not failed or last is None:
            return 0.0
        return float(last + min(BACKOFF_BASE * 2.0 ** (failed - 1), BACKOFF_MAX))

    def _failure_reason(
        self, job: dict[str, Any], active: list[dict[str, Any]], now_s: float
    ) -> tuple[str, str] | None:
        message = self._fail_job.get(job["metadata"]["uid"])
        if message is not None:
            return "PodFailurePolicy", message
        spec = job.get("spec") or {}
        status = job.get("status") or {}
        limit = int(spec.get("backoffLimit", 6))
        policy = (((spec.get("template") or {}).get("spec")) or {}).get("restartPolicy", "OnFailure")
        exceeded = False
        if policy == "OnFailure":
            restarts = 0
            for p in active:
                for cs in (p.get("status") or {}).get("containerStatuses") or []:
                    restarts += int(cs.get("restartCount") or 0)
                for cs in (p.get("status") or {}).get("initContainerStatuses") or []:
                    restarts += int(cs.get("restartCount") or 0)
            exceeded = restarts > 0 if limit == 0 else restarts >= limit
        if int(status.get("failed") or 0) > limit:
            exceeded = True
        if exceeded:
            return "BackoffLimitExceeded", "Job has reached the specified backoff limit"
        ads = spec.get("activeDeadlineSeconds")
        if ads and status.get("startTime") and now_s - unstamp(self.clock, status["startTime"]) >= float(ads):
            return "DeadlineExceeded", "Job was active longer than specified deadline"
        return None

    def _arm_deadline(self, job: dict[str, Any], now_s: float) -> None:
        ads = (job.get("spec") or {}).get("activeDeadlineSeconds")
        start = (job.get("status") or {}).get("startTime")
        if ads and start:
            self.requeue_at(
                unstamp(self.clock, start) + float(ads),
                job["metadata"].get("namespace"),
                job["metadata"]["name"],
            )

    def _pod_for(self, job: dict[str, Any], index: int) -> dict[str, Any]:
        meta = job["metadata"]
        tmpl = copy.deepcopy(((job.get("spec") or {}).get("template")) or {})
        tmeta = tmpl.get("metadata") or {}
        labels = dict(tmeta.get("labels") or {})
        labels.update(
            {
                "batch.kubernetes.io/controller-uid": meta["uid"],
                "batch.kubernetes.io/job-name": meta["name"],
                "controller-uid": meta["uid"],
                "job-name": meta["name"],
                INDEX_KEY: str(index),
            }
        )
        annotations = dict(tmeta.get("annotations") or {})
        annotations[INDEX_KEY] = str(index)
        pspec = tmpl.get("spec") or {}
        pspec.setdefault("restartPolicy", "Never")
        pspec.setdefault("terminationGracePeriodSeconds", 30)
        pspec.setdefault("schedulerName", "default-scheduler")
        pspec.setdefault("dnsPolicy", "ClusterFirst")
        pspec.setdefault("serviceAccountName", "default")
        if pspec.get("subdomain"):
            pspec["hostname"] = f"{meta['name']}-{index}"
        tolerations = list(pspec.get("tolerations") or [])
        for t in DEFAULT_TOLERATIONS:
            if not any(x.get("key") == t["key"] and x.get("effect") == "NoExecute" for x in tolerations):
                tolerations.append(dict(t))
        pspec["tolerations"] = tolerations
        indexed = (job.get("spec") or {}).get("completionMode") == "Indexed"
        for key in ("initContainers", "containers") if indexed else ():  # addCompletionIndexEnvVariables
            for c in pspec.get(key) or []:
                env = c.setdefault("env", [])
                if not any(e.get("name") == COMPLETION_INDEX_ENV for e in env):
                    env.append(
                        {"name": COMPLETION_INDEX_ENV, "valueFrom": {"fieldRef": {"fieldPath": _INDEX_FIELD}}}
                    )
        for c in pspec.get("containers") or []:
            c.setdefault("imagePullPolicy", "IfNotPresent")
            c.setdefault("terminationMessagePath", "/dev/termination-log")
            c.setdefault("terminationMessagePolicy", "File")
            c.setdefault("resources", {})
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": f"{meta['name']}-{index}-",
                "namespace": meta.get("namespace"),
                "labels": labels,
                "annotations": annotations,
                "ownerReferences": [owner_ref(job)],
            },
            "spec": pspec,
            "status": {"phase": "Pending"},
        }
