"""Kueue's scheduler for the simulated Kueue: one pass over the waiting Workloads (BestEffortFIFO by
priority, then age) reserving quota in ClusterQueues, assigning flavors, preempting lower-priority
Workloads under ``withinClusterQueue: LowerPriority``, and explaining ``QuotaReserved=False``.

It runs on the Kueue controller's queue and writes through it (``self.c``): the controller owns the
caches, the waiting and inadmissible sets and the workload conditions.
"""

from __future__ import annotations

import copy
from typing import Any, Protocol

from kubesim.clock import Clock, parse_rfc3339, unstamp
from kubesim.controllers import conditions as cond
from kubesim.controllers.base import Key
from kubesim.controllers.kueue_workload import (
    JOB_UID_LABEL,
    SCHEDULE,
    clear_requeue_at,
    format_amount,
    is_finished,
    quota_reserved,
)
from kubesim.controllers.quantity import parse_quantity, pod_requests
from kubesim.resources import (
    ADMISSIONCHECKS,
    CLUSTERQUEUES,
    LOCALQUEUES,
    RESOURCEFLAVORS,
    WORKLOADS,
    ResourceType,
)


class SchedulerHost(Protocol):
    """The Kueue controller as its scheduler uses it (``kueue.KueueController``): the caches, the
    waiting/inadmissible sets and the workload conditions it owns. Typed here, so this module does not
    import the controller that builds it."""

    _waiting: set[Key]
    _inadmissible: set[Key]
    _usage_of: dict[Key, tuple[str, str, list[tuple[str, str, float]]]]

    @property
    def clock(self) -> Clock: ...
    def now(self) -> str: ...
    def cached(self, rt: ResourceType, namespace: str | None = None) -> list[dict[str, Any]]: ...
    def cached_get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any] | None: ...
    def write(self, rt: ResourceType, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]: ...
    def requeue_at(self, when: float, namespace: str | None, name: str) -> None: ...
    def record_event(
        self, obj: dict[str, Any], etype: str, reason: str, message: str, *, component: str | None = None
    ) -> None: ...
    def _key_of(self, obj: dict[str, Any]) -> Key: ...
    def _pending(self, wl: dict[str, Any], reason: str, message: str) -> None: ...
    def _evict(
        self, wl: dict[str, Any], reason: str, message: str, *, underlying: str = ""
    ) -> dict[str, Any]: ...
    def _cq_problem(self, cq: dict[str, Any], flavors: dict[str, Any], checks: dict[str, Any]) -> bool: ...
    def _cq_checks(self, cq: dict[str, Any]) -> list[str]: ...
    def _admitted_condition(self, wl: dict[str, Any], now: str) -> None: ...


__all__ = ["QuotaScheduler", "SchedulerHost"]


class QuotaScheduler:
    """Quota reservation and preemption for :class:`KueueController` (``controller.scheduler``)."""

    def __init__(self, controller: SchedulerHost) -> None:
        self.c = controller

    def schedule(self) -> None:
        candidates = self.c._waiting - self.c._inadmissible
        if not candidates:
            return
        wls = self.c.cached(WORKLOADS)
        cqs = {c["metadata"]["name"]: c for c in self.c.cached(CLUSTERQUEUES)}
        lqs = {(q["metadata"].get("namespace"), q["metadata"]["name"]): q for q in self.c.cached(LOCALQUEUES)}
        flavors = {f["metadata"]["name"]: f for f in self.c.cached(RESOURCEFLAVORS)}
        checks = {c["metadata"]["name"]: c for c in self.c.cached(ADMISSIONCHECKS)}
        usage: dict[str, dict[tuple[str, str], float]] = {}
        admitted_by_cq: dict[str, list[dict[str, Any]]] = {}
        for wl in wls:
            if quota_reserved(wl) and not is_finished(wl):
                cq, amounts = self._reserved_usage(wl)
                u = usage.setdefault(cq, {})
                for flavor, res, amount in amounts:
                    u[(flavor, res)] = u.get((flavor, res), 0.0) + amount
                admitted_by_cq.setdefault(cq, []).append(wl)

        pending = [w for k in candidates if (w := self.c.cached_get(WORKLOADS, k[0], k[1])) is not None]
        pending.sort(
            key=lambda w: (
                -int((w.get("spec") or {}).get("priority") or 0),
                w["metadata"].get("creationTimestamp", ""),
                w["metadata"]["name"],
            )
        )
        blocked: set[str] = set()
        for wl in pending:
            self._try_admit(wl, cqs, lqs, flavors, checks, usage, admitted_by_cq, blocked)

    def _reserved_usage(self, wl: dict[str, Any]) -> tuple[str, list[tuple[str, str, float]]]:
        """(ClusterQueue, [(flavor, resource, amount)]) a reserving Workload holds, memoised per version."""
        key = self.c._key_of(wl)
        rv = str(wl["metadata"].get("resourceVersion"))
        hit = self.c._usage_of.get(key)
        if hit is not None and hit[0] == rv:
            return hit[1], hit[2]
        admission = (wl.get("status") or {}).get("admission") or {}
        amounts = [
            (str(flavor), str(res), parse_quantity((psa.get("resourceUsage") or {}).get(res, 0)))
            for psa in admission.get("podSetAssignments") or []
            for res, flavor in (psa.get("flavors") or {}).items()
        ]
        cq = str(admission.get("clusterQueue", ""))
        self.c._usage_of[key] = (rv, cq, amounts)
        return cq, amounts

    def _requests(self, wl: dict[str, Any]) -> list[tuple[str, int, dict[str, float]]]:
        out = []
        for ps in (wl.get("spec") or {}).get("podSets") or []:
            # A null count is pruned by the API server, then defaulted to 1 by the CRD.
            count = 1 if ps.get("count") is None else int(ps["count"])
            per_pod = pod_requests(((ps.get("template") or {}).get("spec")) or {})
            out.append((str(ps.get("name")), count, {k: v * count for k, v in per_pod.items() if v > 0}))
        return out

    def _try_admit(
        self,
        wl: dict[str, Any],
        cqs: dict[str, Any],
        lqs: dict[tuple[Any, Any], Any],
        flavors: dict[str, Any],
        checks: dict[str, Any],
        usage: dict[str, dict[tuple[str, str], float]],
        admitted_by_cq: dict[str, list[dict[str, Any]]],
        blocked: set[str],
    ) -> None:
        spec = wl.get("spec") or {}
        ns = wl["metadata"].get("namespace")
        rs = (wl.get("status") or {}).get("requeueState") or {}
        if rs.get("requeueAt") and unstamp(self.c.clock, rs["requeueAt"]) > self.c.clock.now():
            self.c.requeue_at(unstamp(self.c.clock, rs["requeueAt"]), *SCHEDULE)
            return
        lq = lqs.get((ns, spec.get("queueName")))
        if lq is None:
            self.c._pending(wl, "Misconfigured", f"LocalQueue {spec.get('queueName')} doesn't exist")
            return
        cq_name = str((lq.get("spec") or {}).get("clusterQueue") or "")
        cq = cqs.get(cq_name)
        if cq is None:
            self.c._pending(wl, "Misconfigured", f"ClusterQueue {cq_name} doesn't exist")
            return
        if self.c._cq_problem(cq, flavors, checks):
            # AdmissionChecks of other controllers (e.g. dispatch-admission) stay as written: their
            # controller sets Active; until it does, the ClusterQueue is inactive.
            self.c._pending(wl, "Suspended", f"ClusterQueue {cq_name} is inactive")
            return
        if cq_name in blocked:
            return  # a preemptor in this ClusterQueue waits for the quota it freed: nobody overtakes it
        used = usage.setdefault(cq_name, {})
        assignment, reason, message, _ = self._assign(wl, cq, used)
        if assignment is None and reason == "WaitingForQuota":
            admitted = admitted_by_cq.get(cq_name, [])
            leaving = [w for w in admitted if cond.is_true(w, "Evicted")]
            if leaving and self._assign(wl, cq, self._usage_without(used, leaving))[0] is not None:
                # Workloads already being evicted will free enough: wait for them, preempt nothing more.
                blocked.add(cq_name)
                self.c._pending(
                    wl, "WaitingForPreemptedWorkloads", "Waiting for preempted workloads to release quota"
                )
                return
            victims = self._victims(wl, cq, used, admitted, leaving)
            if victims:
                for v in victims:
                    self._preempt(v, wl, cq_name)
                blocked.add(cq_name)
                self.c._pending(
                    wl, "WaitingForPreemptedWorkloads", "Waiting for preempted workloads to release quota"
                )
                return
        if assignment is None:
            self.c._pending(wl, reason, message)
            return
        for psa in assignment:
            for res, flavor in psa["flavors"].items():
                used[(flavor, res)] = used.get((flavor, res), 0.0) + parse_quantity(psa["resourceUsage"][res])
        admitted_by_cq.setdefault(cq_name, []).append(wl)
        self.c._inadmissible.discard(self.c._key_of(wl))
        self._reserve(wl, cq, cq_name, assignment)

    def _assign(
        self, wl: dict[str, Any], cq: dict[str, Any], used: dict[tuple[str, str], float]
    ) -> tuple[list[dict[str, Any]] | None, str, str, dict[tuple[str, str], float]]:
        groups = (cq.get("spec") or {}).get("resourceGroups") or []
        assignment: list[dict[str, Any]] = []
        considered: dict[tuple[str, str], float] = {}
        needed: dict[tuple[str, str], float] = {}
        for ps_name, count, req in self._requests(wl):
            flavors_of: dict[str, str] = {}
            usage_of: dict[str, str] = {}
            for res in sorted(req):
                group = next((g for g in groups if res in (g.get("coveredResources") or [])), None)
                if group is None:
                    if res == "pods":
                        continue  # not managed by this ClusterQueue
                    return (
                        None,
                        "NoMatchingFlavor",
                        f"couldn't assign flavors to pod set {ps_name}: resource {res} unavailable in ClusterQueue",
                        needed,
                    )
                fail_reason, fail_msgs = "", []
                chosen = None
                for flavor in group.get("flavors") or []:
                    fname = str(flavor.get("name"))
                    quota = next((r for r in flavor.get("resources") or [] if r.get("name") == res), None)
                    nominal = parse_quantity((quota or {}).get("nominalQuota", 0))
                    borrow = (quota or {}).get("borrowingLimit")
                    maximum = nominal + (parse_quantity(borrow) if borrow is not None else 0.0)
                    prev = considered.get((fname, res), 0.0)
                    val = prev + req[res]
                    if val > maximum + 1e-9:
                        fail_reason = fail_reason or "ExceedsMaxQuota"
                        fail_msgs.append(
                            f"insufficient quota for {res} in flavor {fname}, previously considered podsets requests "
                            f"({format_amount(res, prev)}) + current podset request ({format_amount(res, req[res])}) > "
                            f"maximum capacity ({format_amount(res, maximum)})"
                        )
                        continue
                    available = nominal - used.get((fname, res), 0.0)
                    if val > available + 1e-9:
                        fail_reason = "WaitingForQuota"
                        fail_msgs.append(
                            f"insufficient unused quota for {res} in flavor {fname}, {format_amount(res, val - available)} more needed"
                        )
                        needed[(fname, res)] = val - available
                        continue
                    chosen = fname
                    break
                if chosen is None:
                    return (
                        None,
                        fail_reason or "NoMatchingFlavor",
                        f"couldn't assign flavors to pod set {ps_name}: " + ", ".join(fail_msgs),
                        needed,
                    )
                considered[(chosen, res)] = considered.get((chosen, res), 0.0) + req[res]
                flavors_of[res] = chosen
                usage_of[res] = format_amount(res, req[res])
            assignment.append(
                {"name": ps_name, "flavors": flavors_of, "resourceUsage": usage_of, "count": count}
            )
        return assignment, "", "", needed

    def _usage_without(
        self, used: dict[tuple[str, str], float], workloads: list[dict[str, Any]]
    ) -> dict[tuple[str, str], float]:
        out = dict(used)
        for w in workloads:
            for flavor, res, amount in self._reserved_usage(w)[1]:
                out[(flavor, res)] = out.get((flavor, res), 0.0) - amount
        return out

    def _victims(
        self,
        wl: dict[str, Any],
        cq: dict[str, Any],
        used: dict[tuple[str, str], float],
        admitted: list[dict[str, Any]],
        leaving: list[dict[str, Any]],
    ) -> list[dict[str, Any]]:
        """Admitted workloads to preempt so that ``wl`` fits, or [] when preemption would not make it fit
        (as Kueue simulates preemption before doing it)."""
        policy = ((cq.get("spec") or {}).get("preemption") or {}).get("withinClusterQueue", "Never")
        if policy not in ("LowerPriority", "LowerOrNewerEqualPriority"):
            return []
        prio = int((wl.get("spec") or {}).get("priority") or 0)
        created = wl["metadata"].get("creationTimestamp", "")

        def eligible(w: dict[str, Any]) -> bool:
            p = int((w.get("spec") or {}).get("priority") or 0)
            if p < prio:
                return True
            newer = w["metadata"].get("creationTimestamp", "") > created
            return policy == "LowerOrNewerEqualPriority" and p == prio and newer

        cands = [w for w in admitted if not cond.is_true(w, "Evicted") and eligible(w)]
        # Lowest priority first, then the most recently admitted.
        cands.sort(
            key=lambda w: (
                int((w.get("spec") or {}).get("priority") or 0),
                -parse_rfc3339(
                    (cond.find(w, "QuotaReserved") or {}).get("lastTransitionTime") or "1970-01-01T00:00:00Z"
                ),
            )
        )
        chosen: list[dict[str, Any]] = []
        for w in cands:
            chosen.append(w)
            if self._assign(wl, cq, self._usage_without(used, leaving + chosen))[0] is not None:
                return chosen
        return []

    def _preempt(self, victim: dict[str, Any], preemptor: dict[str, Any], cq_name: str) -> None:
        pmeta = preemptor["metadata"]
        job_uid = (pmeta.get("labels") or {}).get(JOB_UID_LABEL, "")
        message = (
            f"Preempted to accommodate a workload (UID: {pmeta.get('uid')}, JobUID: {job_uid}) due to prioritization "
            f"in the ClusterQueue; preemptor path: /{cq_name}; preemptee path: /{cq_name}"
        )
        after = copy.deepcopy(victim)
        cond.set_condition(
            after, "Preempted", "True", "InClusterQueue", message, self.c.now(), observed_generation=True
        )
        victim = self.c.write(WORKLOADS, victim, after)
        self.c._evict(victim, "Preempted", message)
        self.c.record_event(victim, "Normal", "Preempted", message, component="kueue-admission")

    def _reserve(
        self, wl: dict[str, Any], cq: dict[str, Any], cq_name: str, assignment: list[dict[str, Any]]
    ) -> None:
        after = copy.deepcopy(wl)
        now = self.c.now()
        status = after.setdefault("status", {})
        status["admission"] = {"clusterQueue": cq_name, "podSetAssignments": assignment}
        cond.set_condition(
            after,
            "QuotaReserved",
            "True",
            "QuotaReserved",
            f"Quota reserved in ClusterQueue {cq_name}",
            now,
            observed_generation=True,
        )
        for ctype in ("Evicted", "Preempted"):
            prev = cond.find(after, ctype)
            if prev is not None and prev.get("status") == "True":
                cond.set_condition(
                    after,
                    ctype,
                    "False",
                    "QuotaReserved",
                    "Previously: " + str(prev.get("message") or ""),
                    now,
                    observed_generation=True,
                )
        existing = {c.get("name"): c for c in status.get("admissionChecks") or []}
        states = []
        for name in self.c._cq_checks(cq):
            states.append(
                existing.get(name)
                or {"name": name, "state": "Pending", "message": "", "lastTransitionTime": now}
            )
        if states:
            status["admissionChecks"] = states
        clear_requeue_at(status)
        self.c._admitted_condition(after, now)
        self.c.write(WORKLOADS, wl, after)
        self.c.record_event(
            wl,
            "Normal",
            "QuotaReserved",
            f"Quota reserved in ClusterQueue {cq_name}, wait time since queued was 0s",
            component="kueue-admission",
        )
        if cond.is_true(after, "Admitted"):
            self.c.record_event(
                wl,
                "Normal",
                "Admitted",
                f"Admitted by ClusterQueue {cq_name}, wait time since reservation was 0s",
                component="kueue-admission",
            )
