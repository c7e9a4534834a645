"""The JobSet v0.12 controller: JobSet → indexed Jobs ``<js>-<rjob>-<i>`` plus a headless Service.

Implements dependsOn (Ready/Complete), successPolicy (All/Any, target replicated jobs), failurePolicy
(nil → the first failed Job fails the JobSet with ``FailedJobs``; rules with ``FailJobSet``/
``RestartJobSet``/``RestartJobSetAndIgnoreMaxRestarts``; ``maxRestarts`` → ``ReachedMaxRestarts``;
restarts recreate every Job with the next ``restart-attempt``), suspend/resume (Jobs suspended; on
resume the pod template's scheduling fields are refreshed from the JobSet), ``replicatedJobsStatus``
and ``terminalState``. Finished JobSets delete their remaining active Jobs.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kubesim.controllers import conditions as cond
from kubesim.controllers.base import BaseController, Key, controller_of, owner_ref
from kubesim.errors import ApiError
from kubesim.resources import JOBS, JOBSETS, SERVICES

if TYPE_CHECKING:
    from kubesim.store import WatchEvent

__all__ = ["JobSetController", "desired_jobs"]

L_JOBSET = "jobset.sigs.k8s.io/jobset-name"
L_RJOB = "jobset.sigs.k8s.io/replicatedjob-name"
L_RJOB_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
L_GLOBAL_REPLICAS = "jobset.sigs.k8s.io/global-replicas"
L_JOB_INDEX = "jobset.sigs.k8s.io/job-index"
L_JOB_GLOBAL_INDEX = "jobset.sigs.k8s.io/job-global-index"
L_JOB_KEY = "jobset.sigs.k8s.io/job-key"
L_RESTART = "jobset.sigs.k8s.io/restart-attempt"
L_UID = "jobset.sigs.k8s.io/jobset-uid"
L_GROUP = "jobset.sigs.k8s.io/group-name"
L_GROUP_REPLICAS = "jobset.sigs.k8s.io/group-replicas"
L_JOB_GROUP_INDEX = "jobset.sigs.k8s.io/job-group-index"


def _job_key(ns: str, name: str) -> str:
    return hashlib.sha1(f"{ns}/{name}".encode()).hexdigest()


def desired_jobs(js: dict[str, Any]) -> list[dict[str, Any]]:
    """Every child Job the JobSet should have in its current restart attempt (pure)."""
    meta = js["metadata"]
    ns, name = meta.get("namespace", ""), meta["name"]
    spec = js.get("spec") or {}
    restarts = int((js.get("status") or {}).get("restarts") or 0)
    rjobs = spec.get("replicatedJobs") or []
    global_replicas = sum(int(r.get("replicas", 1)) for r in rjobs)
    network = spec.get("network") or {}
    subdomain = network.get("subdomain") or name
    out: list[dict[str, Any]] = []
    global_index = 0
    group_replicas: dict[str, int] = {}  # the Jobs of each group, which indexes them in rjob order
    for rjob in rjobs:
        group = str(rjob.get("groupName", "default"))
        group_replicas[group] = group_replicas.get(group, 0) + int(rjob.get("replicas", 1))
    group_index: dict[str, int] = {}
    for rjob in rjobs:
        replicas = int(rjob.get("replicas", 1))
        group = str(rjob.get("groupName", "default"))
        for i in range(replicas):
            job_name = f"{name}-{rjob['name']}-{i}"
            tmpl = copy.deepcopy(rjob.get("template") or {})
            extra = {
                L_JOBSET: name,
                L_RJOB: str(rjob["name"]),
                L_RJOB_REPLICAS: str(replicas),
                L_GLOBAL_REPLICAS: str(global_replicas),
                L_JOB_INDEX: str(i),
                L_JOB_GLOBAL_INDEX: str(global_index),
                L_JOB_KEY: _job_key(ns, job_name),
                L_RESTART: str(restarts),
                L_UID: str(meta.get("uid", "")),
                L_GROUP: group,
                L_GROUP_REPLICAS: str(group_replicas[group]),
                L_JOB_GROUP_INDEX: str(group_index.get(group, 0)),
            }
            global_index += 1
            group_index[group] = group_index.get(group, 0) + 1
            job_meta = tmpl.get("metadata") or {}
            labels = {**(job_meta.get("labels") or {}), **extra}
            annotations = {**(job_meta.get("annotations") or {}), **extra}
            job_spec = tmpl.get("spec") or {}
            pod_tmpl = job_spec.setdefault("template", {})
            pmeta = pod_tmpl.setdefault("metadata", {})
            pmeta["labels"] = {**(pmeta.get("labels") or {}), **extra}
            pmeta["annotations"] = {**(pmeta.get("annotations") or {}), **extra}
            pspec = pod_tmpl.setdefault("spec", {})
            if network.get("enableDNSHostnames", True):
                pspec["subdomain"] = subdomain
            job_spec["suspend"] = bool(spec.get("suspend"))
            job_spec.setdefault("completionMode", "Indexed")
            out.append(
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {
                        "name": job_name,
                        "namespace": ns,
                        "labels": labels,
                        "annotations": annotations,
                        "ownerReferences": [owner_ref(js)],
                    },
                    "spec": job_spec,
                }
            )
    return out


def _job_finished(job: dict[str, Any]) -> str | None:
    if cond.is_true(job, "Complete"):
        return "Complete"
    if cond.is_true(job, "Failed"):
        return "Failed"
    return None


def _job_ready(job: dict[str, Any]) -> bool:
    st = job.get("status") or {}
    want = int((job.get("spec") or {}).get("parallelism") or 1)
    return int(st.get("ready") or 0) + int(st.get("succeeded") or 0) >= want


class JobSetController(BaseController):
    """Reconciles JobSets into Jobs and a headless Service; reports replicatedJobsStatus."""

    name = "jobset"
    cached_kinds = (JOBS,)

    def resync(self) -> None:
        for js in self.store.list(JOBSETS)[0]:
            self.enqueue(js["metadata"].get("namespace"), js["metadata"]["name"])

    def keys_for(self, ev: WatchEvent) -> Iterable[Key]:
        if ev.rt == JOBSETS:
            yield (ev.obj["metadata"].get("namespace", ""), ev.obj["metadata"]["name"])
        elif ev.rt == JOBS:
            ref = controller_of(ev.obj)
            if ref is not None and ref.get("kind") == "JobSet":
                yield (ev.obj["metadata"].get("namespace", ""), str(ref.get("name")))

    def _children(self, js: dict[str, Any]) -> list[dict[str, Any]]:
        return self.cached_owned(JOBS, js["metadata"]["uid"])  # read-only: copy before changing

    def reconcile(self, namespace: str, name: str) -> None:
        js = self.get_or_none(JOBSETS, namespace, name)
        if js is None or js["metadata"].get("deletionTimestamp"):
            return
        before = copy.deepcopy(js)
        status = js.setdefault("status", {})
        status.setdefault("restarts", 0)
        restarts = int(status.get("restarts") or 0)
        children = self._children(js)
        current: list[dict[str, Any]] = []
        for job in children:
            attempt = int((job["metadata"].get("labels") or {}).get(L_RESTART, "0"))
            if attempt < restarts and not job["metadata"].get("deletionTimestamp"):
                self.store.delete(JOBS, namespace, job["metadata"]["name"], propagation="Background")
            elif attempt >= restarts and not job["metadata"].get("deletionTimestamp"):
                current.append(job)

        terminal = status.get("terminalState")
        if terminal:
            for job in current:
                if _job_finished(job) is None:
                    self.store.delete(JOBS, namespace, job["metadata"]["name"], propagation="Background")
        else:
            if not self._handle_failures(js, current):
                self._handle_success(js, current)
            if not status.get("terminalState") and int(status.get("restarts") or 0) == restarts:
                self._ensure_service(js)
                self._ensure_jobs(js, current)
                self._suspend_state(js, current)
            elif status.get("terminalState"):
                for job in current:
                    if _job_finished(job) is None:
                        self.store.delete(JOBS, namespace, job["metadata"]["name"], propagation="Background")
        self._status(js, self._children(js) if status.get("terminalState") is None else current)
        if js.get("status") != before.get("status"):
            body = copy.deepcopy(before)
            body["status"] = js["status"]
            self.store.update_status(JOBSETS, body)

    # -------------------------------------------------------------------------------- failure

    def _handle_failures(self, js: dict[str, Any], jobs: list[dict[str, Any]]) -> bool:
        failed = [j for j in jobs if _job_finished(j) == "Failed"]
        if not failed:
            return False
        failed.sort(key=lambda j: (cond.find(j, "Failed") or {}).get("lastTransitionTime") or "")
        first = failed[0]
        status = js["status"]
        now = self.now()
        policy = (js.get("spec") or {}).get("failurePolicy")
        first_name = first["metadata"]["name"]
        if policy is None:
            self._fail(
                js,
                "FailedJobs",
                f"jobset failed due to one or more job failures (first failed job: {first_name})",
            )
            return True
        fcond = cond.find(first, "Failed") or {}
        rjob_name = (first["metadata"].get("labels") or {}).get(L_RJOB)
        action = "RestartJobSet"
        rule_name = None
        for rule in policy.get("rules") or []:
            reasons = rule.get("onJobFailureReasons") or []
            patterns = rule.get("onJobFailureMessagePatterns") or []
            targets = rule.get("targetReplicatedJobs") or []
            if reasons and fcond.get("reason") not in reasons:
                continue
            if patterns and not any(re.search(p, str(fcond.get("message") or "")) for p in patterns):
                continue
            if targets and rjob_name not in targets:
                continue
            action = str(rule.get("action"))
            rule_name = str(rule.get("name") or "")
            break
        if action == "FailJobSet":
            self._fail(js, "FailJobSetFailurePolicyAction", "applying FailJobSet failure policy action")
            return True
        count_towards = action not in ("RestartJobSetAndIgnoreMaxRestarts", "RestartJobAndIgnoreMaxRestarts")
        max_restarts = int(policy.get("maxRestarts") or 0)
        if count_towards and int(status.get("restartsCountTowardsMax") or 0) >= max_restarts:
            self._fail(js, "ReachedMaxRestarts", "jobset failed due to reaching max number of restarts")
            return True
        status["restarts"] = int(status.get("restarts") or 0) + 1
        if count_towards:
            status["restartsCountTowardsMax"] = int(status.get("restartsCountTowardsMax") or 0) + 1
        reason = f"FailurePolicy_{rule_name}" if rule_name else "DefaultFailurePolicy"
        cond.set_condition(js, "RestartingJobSet", "True", reason, "jobset is restarting", now)
        for job in jobs:
            self.store.delete(
                JOBS, js["metadata"].get("namespace"), job["metadata"]["name"], propagation="Background"
            )
        self.record_event(js, "Warning", "Restarting", f"restarting jobset, attempt {status['restarts']}")
        return True

    def _fail(self, js: dict[str, Any], reason: str, message: str) -> None:
        now = self.now()
        cond.set_condition(js, "Failed", "True", reason, message, now)
        js["status"]["terminalState"] = "Failed"
        if cond.find(js, "RestartingJobSet") is not None:
            cond.set_condition(js, "RestartingJobSet", "False", "JobSetFailed", "jobset failed", now)
        self.record_event(js, "Warning", reason, message)

    def _handle_success(self, js: dict[str, Any], jobs: list[dict[str, Any]]) -> None:
        spec = js.get("spec") or {}
        policy = spec.get("successPolicy") or {"operator": "All"}
        targets = set(
            policy.get("targetReplicatedJobs") or [r["name"] for r in spec.get("replicatedJobs") or []]
        )
        expected = {
            r["name"]: int(r.get("replicas", 1))
            for r in spec.get("replicatedJobs") or []
            if r["name"] in targets
        }
        done: dict[str, int] = {}
        for j in jobs:
            if _job_finished(j) == "Complete":
                rj = (j["metadata"].get("labels") or {}).get(L_RJOB, "")
                done[rj] = done.get(rj, 0) + 1
        if policy.get("operator") == "Any":
            ok = any(done.get(r, 0) > 0 for r in expected)
        else:
            ok = bool(expected) and all(done.get(r, 0) >= n for r, n in expected.items())
        if ok:
            now = self.now()
            cond.set_condition(
                js, "Completed", "True", "AllJobsCompleted", "jobset completed successfully", now
            )
            js["status"]["terminalState"] = "Completed"
            self.record_event(js, "Normal", "AllJobsCompleted", "jobset completed successfully")

    # -------------------------------------------------------------------------------- children

    def _ensure_service(self, js: dict[str, Any]) -> None:
        meta = js["metadata"]
        network = (js.get("spec") or {}).get("network") or {}
        if not network.get("enableDNSHostnames", True):
            return
        svc_name = network.get("subdomain") or meta["name"]
        if self.get_or_none(SERVICES, meta.get("namespace"), svc_name) is not None:
            return
        self.store.create(
            SERVICES,
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {
                    "name": svc_name,
                    "namespace": meta.get("namespace"),
                    "labels": {L_JOBSET: meta["name"]},
                    "ownerReferences": [owner_ref(js)],
                },
                "spec": {
                    "clusterIP": "None",
                    "selector": {L_JOBSET: meta["name"]},
                    "publishNotReadyAddresses": bool(network.get("publishNotReadyAddresses", True)),
                },
            },
        )

    def _deps_ok(self, js: dict[str, Any], rjob: dict[str, Any], jobs: list[dict[str, Any]]) -> bool:
        for dep in rjob.get("dependsOn") or []:
            dep_jobs = [j for j in jobs if (j["metadata"].get("labels") or {}).get(L_RJOB) == dep.get("name")]
            want = next(
                (
                    int(r.get("replicas", 1))
                    for r in js["spec"]["replicatedJobs"]
                    if r["name"] == dep.get("name")
                ),
                0,
            )
            if len(dep_jobs) < want:
                return False
            if dep.get("status") == "Complete":
                if not all(_job_finished(j) == "Complete" for j in dep_jobs):
                    return False
            elif not all(_job_ready(j) or _job_finished(j) == "Complete" for j in dep_jobs):
                return False
        return True

    def _ensure_jobs(self, js: dict[str, Any], jobs: list[dict[str, Any]]) -> None:
        existing = {j["metadata"]["name"] for j in jobs}
        rjobs = {r["name"]: r for r in (js.get("spec") or {}).get("replicatedJobs") or []}
        for job in desired_jobs(js):
            if job["metadata"]["name"] in existing:
                continue
            rjob = rjobs[job["metadata"]["labels"][L_RJOB]]
            if not self._deps_ok(js, rjob, jobs):
                continue
            if self.get_or_none(JOBS, job["metadata"]["namespace"], job["metadata"]["name"]) is not None:
                continue  # an old attempt is still terminating; create once it is gone
            try:
                self.store.create(JOBS, job)
            except ApiError as e:
                if e.code != 422:
                    raise
                # As the JobSet controller does: an Event on the JobSet, and no Job (it retries on change).
                self.record_event(js, "Warning", "JobCreationFailed", e.message)

    def _suspend_state(self, js: dict[str, Any], jobs: list[dict[str, Any]]) -> None:
        spec = js.get("spec") or {}
        suspend = bool(spec.get("suspend"))
        wanted = {j["metadata"]["name"]: j for j in desired_jobs(js)}
        for job in jobs:
            if _job_finished(job) is not None:
                continue
            cur = bool((job.get("spec") or {}).get("suspend"))
            if cur == suspend:
                continue
            after = copy.deepcopy(job)
            after["spec"]["suspend"] = suspend
            want = wanted.get(job["metadata"]["name"])
            if not suspend and want is not None:
                # On resume JobSet refreshes the scheduling directives Kueue may have changed.
                ptmpl = after["spec"].setdefault("template", {})
                wtmpl = want["spec"].get("template") or {}
                ptmpl.setdefault("metadata", {})["labels"] = (wtmpl.get("metadata") or {}).get("labels") or {}
                ptmpl["metadata"]["annotations"] = (wtmpl.get("metadata") or {}).get("annotations") or {}
                pspec = ptmpl.setdefault("spec", {})
                wspec = wtmpl.get("spec") or {}
                for f in ("nodeSelector", "tolerations", "schedulingGates"):
                    if f in wspec:
                        pspec[f] = copy.deepcopy(wspec[f])
                    else:
                        pspec.pop(f, None)
            self.write(JOBS, job, after)
        now = self.now()
        # JobSet records an Event with each condition it changes (its updateCondition options).
        if suspend:
            if cond.set_condition(js, "Suspended", "True", "SuspendedJobs", "jobset is suspended", now):
                self.record_event(js, "Normal", "SuspendedJobs", "jobset is suspended")
        elif cond.find(js, "Suspended") is not None and cond.set_condition(
            js, "Suspended", "False", "ResumeJobs", "jobset is resumed", now
        ):
            self.record_event(js, "Normal", "ResumeJobs", "jobset is resumed")

    def _status(self, js: dict[str, Any], jobs: list[dict[str, Any]]) -> None:
        restarts = int(js["status"].get("restarts") or 0)
        out = []
        for rjob in (js.get("spec") or {}).get("replicatedJobs") or []:
            mine = [
                j
                for j in jobs
                if (j["metadata"].get("labels") or {}).get(L_RJOB) == rjob["name"]
                and int((j["metadata"].get("labels") or {}).get(L_RESTART, "0")) == restarts
            ]
            counts = {"ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}
            for j in mine:
                fin = _job_finished(j)
                st = j.get("status") or {}
                if fin == "Complete":
                    counts["succeeded"] += 1
                elif fin == "Failed":
                    counts["failed"] += 1
                else:
                    if (j.get("spec") or {}).get("suspend"):
                        counts["suspended"] += 1
                    if int(st.get("active") or 0) > 0 and not j["metadata"].get("deletionTimestamp"):
                        counts["active"] += 1
                    if _job_ready(j) and int(st.get("active") or 0) > 0:
                        counts["ready"] += 1
            out.append({"name": rjob["name"], **counts})
        js["status"]["replicatedJobsStatus"] = out
