"""Kueue for TrainJobs: workloads, quota, admission, admission checks, preemption, eviction."""

from __future__ import annotations

import copy

from kubesim.controllers.kueue import workload_name
from kubesim.resources import (
    ADMISSIONCHECKS,
    CLUSTERQUEUES,
    LOCALQUEUES,
    TRAINJOBS,
    WORKLOADPRIORITYCLASSES,
    WORKLOADS,
)
from kubesim.sim import Simulator

from .helpers import NS, condition, jobset, no_controller_errors, pods, submit, tj, trainjob, workload

Q = {"kueue.x-k8s.io/queue-name": "user-queue"}


def queued(
    name: str = "tj",
    *,
    cpu: str = "4",
    nodes: int = 1,
    script: str = "hang",
    prio: str | None = None,
    **kw: object,
) -> dict:
    labels = dict(Q)
    if prio:
        labels["kueue.x-k8s.io/priority-class"] = prio
    return trainjob(
        name, nodes=nodes, script=script, labels=labels, resources={"requests": {"cpu": cpu}}, **kw
    )


def set_quota(sim: Simulator, cpu: str) -> None:
    cq = sim.store.get(CLUSTERQUEUES, None, "cluster-queue")
    for r in cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"]:
        if r["name"] == "cpu":
            r["nominalQuota"] = cpu
    sim.store.replace(CLUSTERQUEUES, cq)
    sim.settle_now()


def priority_class(sim: Simulator, name: str, value: int) -> None:
    sim.store.create(
        WORKLOADPRIORITYCLASSES,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "WorkloadPriorityClass",
            "metadata": {"name": name},
            "value": value,
        },
    )


def test_default_queues_are_active() -> None:
    sim = Simulator()
    cq = condition(sim.store.get(CLUSTERQUEUES, None, "cluster-queue"), "Active")
    assert cq is not None and (cq["status"], cq["reason"], cq["message"]) == (
        "True",
        "Ready",
        "Can admit new workloads",
    )
    lq = condition(sim.store.get(LOCALQUEUES, NS, "user-queue"), "Active")
    assert lq is not None and (lq["status"], lq["message"]) == (
        "True",
        "Can submit new workloads to localQueue",
    )


def test_workload_created_and_admitted() -> None:
    sim = Simulator()
    submit(sim, queued(nodes=2))
    wl = workload(sim)
    job = tj(sim)
    assert wl["metadata"]["name"] == workload_name("tj", job["metadata"]["uid"])
    assert (
        wl["metadata"]["name"].startswith("trainjob-tj-")
        and len(wl["metadata"]["name"]) == len("trainjob-tj-") + 5
    )
    assert wl["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["uid"]
    assert wl["spec"]["queueName"] == "user-queue"
    (ps,) = wl["spec"]["podSets"]
    assert (ps["name"], ps["count"]) == ("node", 2)
    assert condition(wl, "QuotaReserved")["message"] == "Quota reserved in ClusterQueue cluster-queue"  # type: ignore[index]
    assert condition(wl, "Admitted")["reason"] == "Admitted"  # type: ignore[index]
    assert wl["status"]["admission"]["podSetAssignments"] == [
        {
            "name": "node",
            "flavors": {"cpu": "default", "pods": "default"},
            "resourceUsage": {"cpu": "8", "pods": "2"},
            "count": 2,
        }
    ]
    assert job["spec"]["suspend"] is False
    kpatch = next(p for p in job["spec"]["runtimePatches"] if p["manager"] == "kueue.x-k8s.io/manager")
    assert kpatch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["name"] == "node"
    assert condition(job, "Suspended")["reason"] == "Resumed"  # type: ignore[index]
    assert all(p["status"]["phase"] == "Running" for p in pods(sim))
    # The Job counts its ready pods a batch period later; then the JobSet, TrainJob and Workload say so.
    assert condition(workload(sim), "PodsReady")["status"] == "False"  # type: ignore[index]
    sim.advance(1)
    assert condition(workload(sim), "PodsReady")["status"] == "True"  # type: ignore[index]
    no_controller_errors(sim)


def test_finished_when_trainjob_completes() -> None:
    sim = Simulator()
    submit(sim, queued(script="exit 0"))
    sim.advance(1)  # the Job syncs a pod that ended a batch period later (SyncJobBatchPeriod)
    fin = condition(workload(sim), "Finished")
    assert fin is not None and (fin["status"], fin["reason"]) == ("True", "Succeeded")


def test_waiting_for_quota_then_admitted_when_quota_frees() -> None:
    sim = Simulator()
    set_quota(sim, "6")
    submit(sim, queued("a", cpu="4", script="sleep 100; exit 0"))
    submit(sim, queued("b", cpu="4"))
    wl = workload(sim, "b")
    qr = condition(wl, "QuotaReserved")
    assert qr is not None
    assert (qr["status"], qr["reason"]) == ("False", "WaitingForQuota")
    assert (
        qr["message"]
        == "couldn't assign flavors to pod set node: insufficient unused quota for cpu in flavor default, 2 more needed"
    )
    assert tj(sim, "b")["spec"]["suspend"] is True
    assert condition(tj(sim, "b"), "Suspended")["status"] == "True"  # type: ignore[index]
    sim.advance(100)  # a's pod ends; its Job syncs that a batch period later, and only then is a finished
    assert tj(sim, "b")["spec"]["suspend"] is True
    sim.advance(1)
    assert condition(workload(sim, "b"), "Admitted")["status"] == "True"  # type: ignore[index]
    assert tj(sim, "b")["spec"]["suspend"] is False


def test_exceeds_max_quota_and_no_matching_flavor() -> None:
    sim = Simulator()
    submit(sim, queued("big", cpu="100"))
    qr = condition(workload(sim, "big"), "QuotaReserved")
    assert qr is not None and qr["reason"] == "ExceedsMaxQuota"
    assert "current podset request (100) > maximum capacity (64)" in qr["message"]
    submit(
        sim,
        queued("odd", resources_extra=None)
        if False
        else trainjob("odd", labels=Q, resources={"requests": {"example.com/fpga": "1"}}),
    )
    qr = condition(workload(sim, "odd"), "QuotaReserved")
    assert qr is not None and qr["reason"] == "NoMatchingFlavor"
    assert (
        qr["message"]
        == "couldn't assign flavors to pod set node: resource example.com/fpga unavailable in ClusterQueue"
    )


def test_missing_local_queue_is_misconfigured() -> None:
    sim = Simulator()
    submit(sim, trainjob("lost", labels={"kueue.x-k8s.io/queue-name": "nope"}))
    qr = condition(workload(sim, "lost"), "QuotaReserved")
    assert qr is not None and (qr["reason"], qr["message"]) == (
        "Misconfigured",
        "LocalQueue nope doesn't exist",
    )


def test_priority_preemption() -> None:
    sim = Simulator()
    priority_class(sim, "low", 10)
    priority_class(sim, "high", 100)
    set_quota(sim, "8")
    submit(sim, queued("low", cpu="8", prio="low"))
    assert tj(sim, "low")["spec"]["suspend"] is False
    submit(sim, queued("high", cpu="8", prio="high"))
    low = workload(sim, "low")
    ev = condition(low, "Evicted")
    pre = condition(low, "Preempted")
    assert ev is not None and (ev["status"], ev["reason"]) == ("True", "Preempted")
    assert pre is not None and (pre["status"], pre["reason"]) == ("True", "InClusterQueue")
    assert "due to prioritization in the ClusterQueue" in pre["message"]
    assert tj(sim, "low")["spec"]["suspend"] is True
    assert workload(sim, "high")["spec"]["priority"] == 100
    sim.advance(30)  # the low job's pods terminate; then quota is released and the high one admitted
    assert tj(sim, "high")["spec"]["suspend"] is False
    low = workload(sim, "low")
    assert condition(low, "QuotaReserved")["status"] == "False"  # type: ignore[index]
    assert condition(low, "Requeued")["reason"] == "Preempted"  # type: ignore[index]
    assert "admission" not in low["status"]
    kpatch = next(
        p for p in tj(sim, "low")["spec"]["runtimePatches"] if p["manager"] == "kueue.x-k8s.io/manager"
    )
    assert "replicatedJobs" not in kpatch["trainingRuntimeSpec"]["template"]["spec"]
    assert pods(sim, "low") == []
    assert low["status"]["schedulingStats"]["evictions"] == [
        {"reason": "Preempted", "underlyingCause": "", "count": 1}
    ]
    no_controller_errors(sim)


def _with_check(sim: Simulator, active: bool = True) -> None:
    from kubesim.fixtures import add_admission_check

    add_admission_check(sim.store, "dispatch-hold", "dispatch.example.com/admission")
    if active:
        ac = sim.store.get(ADMISSIONCHECKS, None, "dispatch-hold")
        ac["status"] = {
            "conditions": [
                {
                    "type": "Active",
                    "status": "True",
                    "reason": "Active",
                    "message": "ok",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        }
        sim.store.update_status(ADMISSIONCHECKS, ac)
    sim.settle_now()


def _set_check(sim: Simulator, name: str, state: str, message: str = "") -> None:
    wl = workload(sim, name)
    for c in wl["status"]["admissionChecks"]:
        if c["name"] == "dispatch-hold":
            c["state"] = state
            c["message"] = message
    sim.store.update_status(WORKLOADS, wl)
    sim.settle_now()


def test_admission_check_pending_ready_retry() -> None:
    sim = Simulator()
    _with_check(sim)
    submit(sim, queued())
    wl = workload(sim)
    assert condition(wl, "QuotaReserved")["status"] == "True"  # type: ignore[index]
    adm = condition(wl, "Admitted")
    assert adm is not None and (adm["status"], adm["reason"]) == ("False", "UnsatisfiedAdmissionChecks")
    assert wl["status"]["admissionChecks"][0]["state"] == "Pending"
    assert tj(sim)["spec"]["suspend"] is True
    _set_check(sim, "tj", "Ready")
    assert condition(workload(sim), "Admitted")["status"] == "True"  # type: ignore[index]
    assert tj(sim)["spec"]["suspend"] is False
    assert len(pods(sim)) == 1
    _set_check(sim, "tj", "Retry", "held by dispatch")
    # Evicted, stopped (its pods are terminating, so its jobs are inactive), requeued and given quota again
    # in one settle; the eviction stays visible in the conditions and statistics.
    wl = workload(sim)
    ev = condition(wl, "Evicted")
    assert ev is not None and (ev["status"], ev["reason"]) == ("False", "QuotaReserved")
    assert (
        ev["message"]
        == 'Previously: Evicted due to AdmissionCheck in Retry state: "dispatch-hold" (held by dispatch)'
    )
    assert condition(wl, "Requeued")["reason"] == "BackoffFinished"  # type: ignore[index]
    assert wl["status"]["schedulingStats"]["evictions"] == [
        {"reason": "AdmissionCheck", "underlyingCause": "", "count": 1}
    ]
    assert tj(sim)["spec"]["suspend"] is True
    assert all(p["metadata"].get("deletionTimestamp") for p in pods(sim))
    sim.advance(30)
    assert pods(sim) == []
    wl = workload(sim)
    # Waiting for the check once more.
    assert wl["status"]["admissionChecks"][0]["state"] == "Pending"
    assert condition(wl, "Admitted")["status"] == "False"  # type: ignore[index]
    assert tj(sim)["spec"]["suspend"] is True
    no_controller_errors(sim)


def test_inactive_admission_check_blocks_the_queue() -> None:
    sim = Simulator()
    _with_check(sim, active=False)
    submit(sim, queued())
    qr = condition(workload(sim), "QuotaReserved")
    assert qr is not None and qr["message"] == "ClusterQueue cluster-queue is inactive"
    ac = sim.store.get(ADMISSIONCHECKS, None, "dispatch-hold")
    assert "status" not in ac or not ac["status"].get("conditions")  # left as written: not our controller
    cq_active = condition(sim.store.get(CLUSTERQUEUES, None, "cluster-queue"), "Active")
    assert cq_active is not None
    assert (cq_active["status"], cq_active["reason"], cq_active["message"]) == (
        "False",
        "AdmissionCheckInactive",
        "Can't admit new workloads: references inactive AdmissionCheck(s): dispatch-hold.",
    )
    lq_active = condition(sim.store.get(LOCALQUEUES, NS, "user-queue"), "Active")
    assert lq_active is not None and (lq_active["status"], lq_active["reason"]) == (
        "False",
        "ClusterQueueIsInactive",
    )


def test_rejected_check_deactivates() -> None:
    sim = Simulator()
    _with_check(sim)
    submit(sim, queued())
    _set_check(sim, "tj", "Rejected", "no")
    wl = workload(sim)
    assert wl["spec"]["active"] is False
    assert condition(wl, "Evicted")["reason"] == "Deactivated"  # type: ignore[index]


def test_node_failure_evicts() -> None:
    sim = Simulator()
    submit(sim, queued())
    (p,) = pods(sim)
    sim.actions.lose_node(p["spec"]["nodeName"])
    sim.settle_now()
    wl = workload(sim)
    ev = condition(wl, "Evicted")
    assert ev is not None and ev["message"].startswith("Previously: Workload eviction triggered due to")
    assert wl["status"]["schedulingStats"]["evictions"] == [
        {"reason": "NodeFailures", "underlyingCause": "", "count": 1}
    ]
    sim.advance(31)
    wl = workload(sim)
    assert condition(wl, "Requeued")["reason"] == "NodeFailures"  # type: ignore[index]
    # Readmitted; the new pod avoids the lost node (its taint).
    assert condition(wl, "Admitted")["status"] == "True"  # type: ignore[index]
    assert all(x["spec"].get("nodeName") != p["spec"]["nodeName"] for x in pods(sim))


def test_maximum_execution_time() -> None:
    sim = Simulator()
    labels = {"kueue.x-k8s.io/max-exec-time-seconds": "60"}
    body = queued()
    body["metadata"]["labels"].update(labels)
    submit(sim, body)
    assert workload(sim)["spec"]["maximumExecutionTimeSeconds"] == 60
    sim.advance(60)
    wl = workload(sim)
    assert wl["spec"]["active"] is False
    ev = condition(wl, "Evicted")
    assert ev is not None
    assert (ev["reason"], ev["message"]) == (
        "Deactivated",
        "The workload is deactivated due to exceeding the maximum execution time",
    )
    assert (
        wl["status"]["schedulingStats"]["evictions"][0]["underlyingCause"] == "MaximumExecutionTimeExceeded"
    )
    assert tj(sim)["spec"]["suspend"] is True


def test_resume_applies_flavor_node_labels() -> None:
    sim = Simulator()
    from kubesim.resources import RESOURCEFLAVORS

    rf = sim.store.get(RESOURCEFLAVORS, None, "default")
    rf["spec"] = {"nodeLabels": {"kubernetes.io/os": "linux"}}
    sim.store.replace(RESOURCEFLAVORS, rf)
    submit(sim, queued())
    js = jobset(sim)
    pod_spec = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert pods(sim)[0]["spec"]["nodeSelector"] == {"kubernetes.io/os": "linux"}


def test_no_workload_without_queue_label() -> None:
    sim = Simulator()
    submit(sim, trainjob("free"))
    assert sim.store.list(WORKLOADS, NS)[0] == []
    assert tj(sim, "free")["spec"]["suspend"] is False


def test_kueue_off() -> None:
    sim = Simulator(kueue=False)
    body = copy.deepcopy(queued())
    submit(sim, body)
    assert sim.store.list(WORKLOADS, NS)[0] == []
    assert sim.store.get(TRAINJOBS, NS, "tj")["spec"]["suspend"] is False


def test_own_runtime_patch_survives_kueue_patch() -> None:
    sim = Simulator()
    own = {
        "manager": "example.com/dispatch",
        "trainingRuntimeSpec": {
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "spec": {
                                    "template": {
                                        "metadata": {"labels": {"example.com/job": "a"}},
                                        "spec": {"tolerations": [{"key": "dedicated", "operator": "Exists"}]},
                                    }
                                }
                            },
                        }
                    ]
                }
            }
        },
    }
    submit(sim, queued(runtimePatches=[own]))
    (p,) = pods(sim)
    assert p["metadata"]["labels"]["example.com/job"] == "a"
    assert {"key": "dedicated", "operator": "Exists"} in p["spec"]["tolerations"]
    managers = [x["manager"] for x in tj(sim)["spec"]["runtimePatches"]]
    assert managers == ["example.com/dispatch", "kueue.x-k8s.io/manager"]


def test_upstream_default_reasons_without_the_observability_gate() -> None:
    from kubesim import fixtures
    from kubesim.controllers import KueueController, default_controllers

    ctrls = [
        KueueController(unadmitted_observability=False) if c.name == "kueue" else c
        for c in default_controllers()
    ]
    sim = Simulator(controllers=ctrls)
    fixtures.install(sim)
    submit(sim, queued("big", cpu="100"))
    qr = condition(workload(sim, "big"), "QuotaReserved")
    assert qr is not None and (qr["status"], qr["reason"]) == ("False", "Pending")
    assert "> maximum capacity (64)" in qr["message"]
    assert condition(workload(sim, "big"), "Admitted") is None
    submit(sim, trainjob("lost", labels={"kueue.x-k8s.io/queue-name": "nope"}))
    qr = condition(workload(sim, "lost"), "QuotaReserved")
    assert qr is not None and (qr["reason"], qr["message"]) == (
        "Inadmissible",
        "LocalQueue nope doesn't exist",
    )
    _with_check(sim)
    submit(sim, queued("held"))
    wl = workload(sim, "held")
    assert condition(wl, "QuotaReserved")["status"] == "True"  # type: ignore[index]
    assert condition(wl, "Admitted") is None  # appears only once admitted
    _set_check(sim, "held", "Ready")
    assert condition(workload(sim, "held"), "Admitted")["status"] == "True"  # type: ignore[index]


def test_retry_with_requeue_after_seconds() -> None:
    sim = Simulator()
    _with_check(sim)
    submit(sim, queued())
    _set_check(sim, "tj", "Ready")
    wl = workload(sim)
    for c in wl["status"]["admissionChecks"]:
        c.update(state="Retry", message="later", requeueAfterSeconds=60)
    sim.store.update_status(WORKLOADS, wl)
    sim.settle_now()
    wl = workload(sim)
    req = condition(wl, "Requeued")
    assert req is not None and (req["status"], req["reason"]) == ("False", "AdmissionCheck")
    assert wl["status"]["requeueState"]["requeueAt"] == "2026-01-01T00:01:00Z"
    assert condition(wl, "QuotaReserved")["status"] == "False"  # type: ignore[index]
    sim.advance(59)
    assert condition(workload(sim), "QuotaReserved")["status"] == "False"  # type: ignore[index]
    sim.advance(1)
    wl = workload(sim)
    assert condition(wl, "Requeued")["reason"] == "BackoffFinished"  # type: ignore[index]
    assert "requeueState" not in wl["status"]
    assert condition(wl, "QuotaReserved")["status"] == "True"  # type: ignore[index]


def test_preemption_only_when_it_makes_room() -> None:
    sim = Simulator()
    priority_class(sim, "low", 10)
    priority_class(sim, "mid", 50)
    priority_class(sim, "high", 100)
    set_quota(sim, "8")
    submit(sim, queued("low", cpu="4", prio="low"))
    submit(sim, queued("mid", cpu="4", prio="mid"))
    submit(sim, queued("huge", cpu="12", prio="high"))
    # 12 > 8 can never fit: nobody is preempted.
    assert condition(workload(sim, "huge"), "QuotaReserved")["reason"] == "ExceedsMaxQuota"  # type: ignore[index]
    assert condition(workload(sim, "low"), "Evicted") is None
    submit(sim, queued("high", cpu="8", prio="high"))
    assert condition(workload(sim, "low"), "Preempted")["status"] == "True"  # type: ignore[index]
    assert condition(workload(sim, "mid"), "Preempted")["status"] == "True"  # type: ignore[index]
    sim.advance(30)
    assert condition(workload(sim, "high"), "Admitted")["status"] == "True"  # type: ignore[index]
    for name in ("low", "mid"):
        qr = condition(workload(sim, name), "QuotaReserved")
        assert qr is not None and (qr["status"], qr["reason"]) == ("False", "WaitingForQuota")
    no_controller_errors(sim)
