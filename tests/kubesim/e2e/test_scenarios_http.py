"""The scenarios a TrainJob goes through, seen by a client over real HTTP (issue #3).

Each test creates objects with lightkube's ``AsyncClient`` as a user (or an external controller) would,
moves simulated time with the ManualClock (``sim.advance``), disrupts the cluster with ``sim.actions`` or
a ``KUBESIM_SCRIPT`` where a real cluster event would come from outside, and asserts only what the API
shows: TrainJob, JobSet, pod, node and Workload status read back over HTTP, and watch events.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError as LkApiError
from lightkube.generic_resource import create_global_resource
from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from kubesim import Simulator

from .conftest import JobSet, TrainJob, Workload

NS = "default"
QUEUE = {"kueue.x-k8s.io/queue-name": "user-queue"}
CHECK = "dispatch-hold"

ClusterQueue = create_global_resource("kueue.x-k8s.io", "v1beta2", "ClusterQueue", "clusterqueues")
AdmissionCheck = create_global_resource("kueue.x-k8s.io", "v1beta2", "AdmissionCheck", "admissionchecks")
WorkloadPriorityClass = create_global_resource(
    "kueue.x-k8s.io", "v1beta2", "WorkloadPriorityClass", "workloadpriorityclasses"
)
ClusterTrainingRuntime = create_global_resource(
    "trainer.kubeflow.org", "v1alpha1", "ClusterTrainingRuntime", "clustertrainingruntimes"
)
# Nodes also read as plain JSON, for dict access to conditions and taints (typed reads: see the end).
NodeJson = create_global_resource("", "v1", "Node", "nodes")


# --------------------------------------------------------------------------------------------- helpers


def trainjob(
    name: str,
    *,
    script: str = "hang",
    nodes: int = 1,
    labels: dict[str, str] | None = None,
    cpu: str | None = None,
    runtime: str = "torch-distributed",
    **spec: Any,
) -> Any:
    trainer: dict[str, Any] = {
        "image": "registry.example.com/train:1",
        "command": ["python", "train.py"],
        "numNodes": nodes,
        "env": [{"name": "KUBESIM_SCRIPT", "value": script}],
    }
    if cpu is not None:
        trainer["resourcesPerNode"] = {"requests": {"cpu": cpu}}
    return TrainJob(
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
            "spec": {"runtimeRef": {"name": runtime}, "trainer": trainer, **spec},
        }
    )


def cond(obj: Any, ctype: str) -> dict[str, Any] | None:
    """The condition ``ctype`` of a generic resource, a typed pod/node, or a raw dict, as a dict."""
    if isinstance(obj, dict):
        status = obj.get("status") or {}
    elif isinstance(obj.status, dict):
        status = obj.status
    else:
        status = obj.status.to_dict()
    for c in status.get("conditions") or []:
        if c["type"] == ctype:
            return dict(c)
    return None


def summary(c: dict[str, Any] | None) -> tuple[str, str] | None:
    return None if c is None else (c["status"], c.get("reason", ""))


async def job_pods(client: AsyncClient, name: str) -> list[Pod]:
    pods = client.list(Pod, namespace=NS, labels={"jobset.sigs.k8s.io/jobset-name": name})
    return sorted([p async for p in pods], key=lambda p: p.metadata.name)


def main_status(pod: Pod) -> Any:
    (st,) = [s for s in pod.status.containerStatuses if s.name == "node"]
    return st


async def workload_of(client: AsyncClient, trainjob_name: str) -> Any:
    (wl,) = [
        w
        async for w in client.list(Workload, namespace=NS)
        if w.metadata.ownerReferences[0].name == trainjob_name
    ]
    return wl


async def watch_until(
    client: AsyncClient, res: Any, since: str, done: Callable[[str, Any], bool], **kw: Any
) -> list[tuple[str, Any]]:
    """Read a watch from ``since`` until ``done(type, obj)`` holds; the events replayed so far."""
    seen: list[tuple[str, Any]] = []

    async def read() -> None:
        async for typ, obj in client.watch(res, namespace=NS, resource_version=since, **kw):
            seen.append((typ, obj))
            if done(typ, obj):
                return

    await asyncio.wait_for(read(), 5)
    return seen


def no_controller_errors(sim: Simulator) -> None:
    assert sim.controller_errors == []
    assert [e for c in sim.controllers for e in getattr(c, "errors", [])] == []


async def set_cpu_quota(client: AsyncClient, cpu: str) -> None:
    """Change the ClusterQueue's nominal cpu quota with a PUT, as a cluster admin would."""
    cq = await client.get(ClusterQueue, "cluster-queue")
    for r in cq.spec["resourceGroups"][0]["flavors"][0]["resources"]:
        if r["name"] == "cpu":
            r["nominalQuota"] = cpu
    await client.replace(cq)


async def install_admission_check(client: AsyncClient) -> None:
    """An AdmissionCheck made active by its (external) controller and required by the ClusterQueue."""
    ac = AdmissionCheck(
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": CHECK},
            "spec": {"controllerName": "dispatch.example.com/admission"},
        }
    )
    ac = await client.create(ac)
    active = {
        "type": "Active",
        "status": "True",
        "reason": "Active",
        "message": "the dispatch admission controller is running",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    await client.patch(
        AdmissionCheck.Status, CHECK, {"status": {"conditions": [active]}}, patch_type=PatchType.MERGE
    )
    cq = await client.get(ClusterQueue, "cluster-queue")
    cq.spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": CHECK}]}
    await client.replace(cq)


async def set_check_state(client: AsyncClient, wl_name: str, state: str, message: str, **extra: Any) -> None:
    """Write the check's state on the Workload through the status subresource, as its controller does."""
    check = {
        "name": CHECK,
        "state": state,
        "message": message,
        "lastTransitionTime": "2026-01-01T00:00:00Z",
        **extra,
    }
    await client.patch(
        Workload.Status,
        wl_name,
        {"status": {"admissionChecks": [check]}},
        namespace=NS,
        patch_type=PatchType.MERGE,
    )


# ------------------------------------------------------------------------------------------- scenarios


async def test_exit_code_under_on_failure_restarts_then_fails_the_trainjob(
    sim: Simulator, client: AsyncClient
) -> None:
    await client.create(trainjob("ec", script="print boom; exit 3"))
    await sim.settle()
    (pod,) = await job_pods(client, "ec")
    st = main_status(pod)
    # restartPolicy OnFailure (the runtime's): the container restarts in place, the exit is in lastState.
    assert pod.status.phase == "Running"
    assert (st.lastState.terminated.exitCode, st.lastState.terminated.reason) == (3, "Error")
    assert st.restartCount == 1
    assert st.state.waiting.reason == "CrashLoopBackOff"
    since = (await client.get(TrainJob, "ec", namespace=NS)).metadata.resourceVersion

    sim.advance(2000)  # back-offs 10, 20, 40, 80, 160 s: the sixth failure reaches backoffLimit 6
    await sim.settle()
    tj = await client.get(TrainJob, "ec", namespace=NS)
    failed = cond(tj, "Failed")
    assert failed is not None and failed["status"] == "True"
    js_failed = cond(await client.get(JobSet, "ec", namespace=NS), "Failed")
    assert js_failed is not None
    # The TrainJob carries the JobSet's reason and message.
    assert (failed["reason"], failed["message"]) == (js_failed["reason"], js_failed["message"])
    assert (failed["reason"], failed["message"]) == (
        "FailedJobs",
        "jobset failed due to one or more job failures (first failed job: ec-node-0)",
    )
    assert await job_pods(client, "ec") == []  # the failed Job deleted its pods
    events = await watch_until(client, TrainJob, since, lambda _t, o: cond(o, "Failed") is not None)
    assert summary(cond(events[-1][1], "Failed")) == ("True", "FailedJobs")
    no_controller_errors(sim)


async def test_exit_code_under_never_is_the_terminated_state(sim: Simulator, client: AsyncClient) -> None:
    # A cluster admin publishes a runtime whose pods never restart and whose Job allows no retry.
    base = await client.get(ClusterTrainingRuntime, "torch-distributed")
    spec = base.spec
    job_spec = spec["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    job_spec["backoffLimit"] = 0
    job_spec["template"]["spec"]["restartPolicy"] = "Never"
    created = await client.create(
        ClusterTrainingRuntime(
            {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "ClusterTrainingRuntime",
                "metadata": {"name": "torch-never"},
                "spec": spec,
            }
        )
    )
    # the fixture runtime's version predates the server's start (410 to watch from): use the new one's
    since = created.metadata.resourceVersion
    await client.create(trainjob("never", runtime="torch-never", script="print bye; exit 7"))
    await sim.settle()
    sim.advance(1)  # the Job syncs its failed pod a batch period later
    await sim.settle()
    tj = await client.get(TrainJob, "never", namespace=NS)
    failed = cond(tj, "Failed")
    assert summary(failed) == ("True", "FailedJobs")
    assert failed is not None
    assert (
        failed["message"] == "jobset failed due to one or more job failures (first failed job: never-node-0)"
    )
    # The failed pod is kept (finished pods are not deleted), its exit in state.terminated.
    (pod,) = await job_pods(client, "never")
    assert pod.status.phase == "Failed"
    terminated = main_status(pod).state.terminated
    assert (terminated.exitCode, terminated.reason) == (7, "Error")
    assert main_status(pod).restartCount == 0
    # A pod watch shows the same ending.
    events = await watch_until(
        client,
        Pod,
        since,
        lambda _t, p: p.status.phase == "Failed",
        labels={"jobset.sigs.k8s.io/jobset-name": "never"},
    )
    assert main_status(events[-1][1]).state.terminated.exitCode == 7
    job_failed = cond(await client.get(JobSet, "never", namespace=NS), "Failed")
    assert summary(job_failed) == ("True", "FailedJobs")
    no_controller_errors(sim)


async def test_oom_shows_in_last_state_while_the_pod_restarts_in_place(
    sim: Simulator, client: AsyncClient
) -> None:
    await client.create(trainjob("oom", script="print loading; sleep 10; oom"))
    await sim.settle()
    (before,) = await job_pods(client, "oom")
    assert main_status(before).state.running is not None
    assert main_status(before).lastState.terminated is None
    sim.advance(10)
    await sim.settle()
    (pod,) = await job_pods(client, "oom")
    assert pod.metadata.name == before.metadata.name  # the same pod: restarted in place
    assert pod.metadata.uid == before.metadata.uid
    assert pod.status.phase == "Running"
    st = main_status(pod)
    assert (st.lastState.terminated.reason, st.lastState.terminated.exitCode) == ("OOMKilled", 137)
    assert st.restartCount == 1
    assert st.state.waiting.reason == "CrashLoopBackOff"
    assert cond(await client.get(TrainJob, "oom", namespace=NS), "Failed") is None
    # After the back-off the container runs again (and is OOM-killed again 10 s later).
    sim.advance(10)
    await sim.settle()
    (pod,) = await job_pods(client, "oom")
    assert main_status(pod).state.running is not None
    assert main_status(pod).restartCount == 1
    no_controller_errors(sim)


async def test_oom_from_outside_on_a_running_pod(sim: Simulator, client: AsyncClient) -> None:
    await client.create(trainjob("ooma", nodes=2, script="hang"))
    await sim.settle()
    p0, p1 = await job_pods(client, "ooma")
    since = p1.metadata.resourceVersion
    sim.actions.oom(NS, p0.metadata.name)
    await sim.settle()
    events = await watch_until(
        client,
        Pod,
        since,
        lambda _t, p: p.metadata.name == p0.metadata.name and main_status(p).restartCount == 1,
    )
    st = main_status(events[-1][1])
    assert st.lastState.terminated.reason == "OOMKilled"
    assert st.lastState.terminated.exitCode == 137
    assert main_status(await client.get(Pod, p1.metadata.name, namespace=NS)).restartCount == 0


async def test_deadline_fails_the_trainjob_and_terminates_pods(sim: Simulator, client: AsyncClient) -> None:
    await client.create(trainjob("dl", nodes=2, activeDeadlineSeconds=30))
    await sim.settle()
    assert [p.status.phase for p in await job_pods(client, "dl")] == ["Running", "Running"]
    sim.advance(30)
    await sim.settle()
    assert cond(await client.get(TrainJob, "dl", namespace=NS), "Failed") is None  # strictly after
    sim.advance(1)
    await sim.settle()
    failed = cond(await client.get(TrainJob, "dl", namespace=NS), "Failed")
    assert failed is not None
    assert (failed["status"], failed["reason"], failed["message"]) == (
        "True",
        "DeadlineExceeded",
        "TrainJob exceeded its active deadline",
    )
    with pytest.raises(LkApiError) as info:
        await client.get(JobSet, "dl", namespace=NS)
    assert info.value.status.code == 404
    pods = await job_pods(client, "dl")
    assert len(pods) == 2
    assert all(p.metadata.deletionTimestamp is not None for p in pods)  # terminating for their grace
    since = pods[-1].metadata.resourceVersion
    sim.advance(30)
    await sim.settle()
    assert await job_pods(client, "dl") == []
    deleted = await watch_until(
        client,
        Pod,
        since,
        lambda t, _p: t == "DELETED",
        labels={"jobset.sigs.k8s.io/jobset-name": "dl"},
    )
    last = deleted[-1][1]
    assert last.status.phase == "Failed"
    assert main_status(last).state.terminated.exitCode == 143  # SIGTERM at the end of the grace period
    failed = cond(await client.get(TrainJob, "dl", namespace=NS), "Failed")
    assert summary(failed) == ("True", "DeadlineExceeded")
    no_controller_errors(sim)


async def test_suspend_and_resume_with_a_merge_patch(sim: Simulator, client: AsyncClient) -> None:
    await client.create(trainjob("sr", nodes=2, activeDeadlineSeconds=100))
    await sim.settle()
    first = {p.metadata.name for p in await job_pods(client, "sr")}
    assert len(first) == 2
    sim.advance(60)

    await client.patch(TrainJob, "sr", {"spec": {"suspend": True}}, namespace=NS, patch_type=PatchType.MERGE)
    await sim.settle()
    tj = await client.get(TrainJob, "sr", namespace=NS)
    assert tj.spec["suspend"] is True
    susp = cond(tj, "Suspended")
    assert susp is not None
    assert (susp["status"], susp["reason"], susp["message"]) == ("True", "Suspended", "TrainJob is suspended")
    assert tj.status["jobsStatus"] == [
        {"name": "node", "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 1}
    ]
    js = await client.get(JobSet, "sr", namespace=NS)
    assert js.spec["suspend"] is True
    assert summary(cond(js, "Suspended")) == ("True", "SuspendedJobs")
    pods = await job_pods(client, "sr")
    assert {p.metadata.name for p in pods} == first
    assert all(p.metadata.deletionTimestamp is not None for p in pods)
    sim.advance(30)
    await sim.settle()
    assert await job_pods(client, "sr") == []

    await client.patch(TrainJob, "sr", {"spec": {"suspend": False}}, namespace=NS, patch_type=PatchType.MERGE)
    await sim.settle()
    tj = await client.get(TrainJob, "sr", namespace=NS)
    resumed = cond(tj, "Suspended")
    assert resumed is not None
    assert (resumed["status"], resumed["reason"], resumed["message"]) == (
        "False",
        "Resumed",
        "TrainJob is resumed",
    )
    assert summary(cond(await client.get(JobSet, "sr", namespace=NS), "Suspended")) == ("False", "ResumeJobs")
    sim.advance(1)  # the Job counts its new pods ready a batch period later
    await sim.settle()
    tj = await client.get(TrainJob, "sr", namespace=NS)
    # Pods deleted by a suspension are not failures.
    assert tj.status["jobsStatus"] == [
        {"name": "node", "ready": 1, "succeeded": 0, "failed": 0, "active": 1, "suspended": 0}
    ]
    pods = await job_pods(client, "sr")
    assert len(pods) == 2 and {p.metadata.name for p in pods}.isdisjoint(first)
    assert all(p.status.phase == "Running" for p in pods)
    # The active deadline counts again from the resume (90 s of running time have passed in all).
    sim.advance(99)  # 100 s after the resume
    await sim.settle()
    assert cond(await client.get(TrainJob, "sr", namespace=NS), "Failed") is None
    sim.advance(1)
    await sim.settle()
    assert summary(cond(await client.get(TrainJob, "sr", namespace=NS), "Failed")) == (
        "True",
        "DeadlineExceeded",
    )
    no_controller_errors(sim)


async def test_kueue_queueing_until_quota_frees(sim: Simulator, client: AsyncClient) -> None:
    await set_cpu_quota(client, "6")
    await client.create(trainjob("first", cpu="4", script="sleep 100; exit 0", labels=QUEUE))
    await client.create(trainjob("second", cpu="4", labels=QUEUE))
    await sim.settle()
    assert summary(cond(await workload_of(client, "first"), "Admitted")) == ("True", "Admitted")
    wl = await workload_of(client, "second")
    assert wl.spec["queueName"] == "user-queue"
    reserved = cond(wl, "QuotaReserved")
    assert reserved is not None
    assert (reserved["status"], reserved["reason"], reserved["message"]) == (
        "False",
        "WaitingForQuota",
        "couldn't assign flavors to pod set node: insufficient unused quota for cpu in flavor default, "
        "2 more needed",
    )
    second = await client.get(TrainJob, "second", namespace=NS)
    assert second.spec["suspend"] is True
    assert summary(cond(second, "Suspended")) == ("True", "Suspended")
    assert await job_pods(client, "second") == []
    since = wl.metadata.resourceVersion

    sim.advance(100)  # the first job's pod ends; its Job syncs that a batch period later
    await sim.settle()
    assert cond(await workload_of(client, "first"), "Finished") is None
    sim.advance(1)  # the first job finishes and its quota is released
    await sim.settle()
    first_wl = await workload_of(client, "first")
    assert summary(cond(first_wl, "Finished")) == ("True", "Succeeded")
    events = await watch_until(
        client,
        Workload,
        since,
        lambda _t, w: (
            w.metadata.name == wl.metadata.name and summary(cond(w, "Admitted")) == ("True", "Admitted")
        ),
    )
    assert events[-1][0] == "MODIFIED"
    assert (await client.get(TrainJob, "second", namespace=NS)).spec["suspend"] is False
    assert [p.status.phase for p in await job_pods(client, "second")] == ["Running"]
    no_controller_errors(sim)


async def test_kueue_priority_preemption(sim: Simulator, client: AsyncClient) -> None:
    for name, value in (("low", 10), ("high", 100)):
        await client.create(
            WorkloadPriorityClass(
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta2",
                    "kind": "WorkloadPriorityClass",
                    "metadata": {"name": name},
                    "value": value,
                }
            )
        )
    await set_cpu_quota(client, "8")
    await client.create(trainjob("low", cpu="8", labels=QUEUE | {"kueue.x-k8s.io/priority-class": "low"}))
    await sim.settle()
    low_wl = await workload_of(client, "low")
    assert summary(cond(low_wl, "Admitted")) == ("True", "Admitted")
    assert low_wl.spec["priority"] == 10
    assert [p.status.phase for p in await job_pods(client, "low")] == ["Running"]
    since = low_wl.metadata.resourceVersion

    await client.create(trainjob("high", cpu="8", labels=QUEUE | {"kueue.x-k8s.io/priority-class": "high"}))
    await sim.settle()
    high_wl = await workload_of(client, "high")
    events = await watch_until(
        client,
        Workload,
        since,
        lambda _t, w: w.metadata.name == low_wl.metadata.name and cond(w, "Evicted") is not None,
    )
    low_seen = events[-1][1]
    evicted, preempted = cond(low_seen, "Evicted"), cond(low_seen, "Preempted")
    assert summary(evicted) == ("True", "Preempted")
    assert summary(preempted) == ("True", "InClusterQueue")
    assert evicted is not None
    assert evicted["message"] == (
        f"Preempted to accommodate a workload (UID: {high_wl.metadata.uid}, JobUID: "
        f"{(await client.get(TrainJob, 'high', namespace=NS)).metadata.uid}) due to prioritization in the "
        "ClusterQueue; preemptor path: /cluster-queue; preemptee path: /cluster-queue"
    )
    low = await client.get(TrainJob, "low", namespace=NS)
    assert low.spec["suspend"] is True  # re-suspended by Kueue
    assert summary(cond(low, "Suspended")) == ("True", "Suspended")
    assert all(p.metadata.deletionTimestamp is not None for p in await job_pods(client, "low"))
    # Once the low job is stopped (its Jobs have no active pods, only terminating ones) Kueue releases
    # its quota and admits the high one.
    high = await client.get(TrainJob, "high", namespace=NS)
    assert high.spec["suspend"] is False
    assert summary(cond(await workload_of(client, "high"), "Admitted")) == ("True", "Admitted")
    assert [p.status.phase for p in await job_pods(client, "high")] == ["Running"]

    sim.advance(30)  # the low job's pods finish terminating
    await sim.settle()
    low_wl = await workload_of(client, "low")
    assert summary(cond(low_wl, "Requeued")) == ("True", "Preempted")
    assert summary(cond(low_wl, "QuotaReserved")) == ("False", "WaitingForQuota")
    assert "admission" not in low_wl.status
    assert low_wl.status["schedulingStats"]["evictions"] == [
        {"reason": "Preempted", "underlyingCause": "", "count": 1}
    ]
    assert await job_pods(client, "low") == []
    low = await client.get(TrainJob, "low", namespace=NS)
    assert low.spec["suspend"] is True
    # Kueue's runtime patch no longer carries the flavor it had assigned.
    (kueue_patch,) = [p for p in low.spec["runtimePatches"] if p["manager"] == "kueue.x-k8s.io/manager"]
    assert "replicatedJobs" not in kueue_patch["trainingRuntimeSpec"]["template"]["spec"]
    assert (await client.get(JobSet, "low", namespace=NS)).spec["suspend"] is True
    no_controller_errors(sim)


async def test_kueue_node_failure_eviction(sim: Simulator, client: AsyncClient) -> None:
    await client.create(trainjob("nf", labels=QUEUE))
    await sim.settle()
    wl = await workload_of(client, "nf")
    assert summary(cond(wl, "Admitted")) == ("True", "Admitted")
    (pod,) = await job_pods(client, "nf")
    lost = pod.spec.nodeName
    since = wl.metadata.resourceVersion

    sim.actions.lose_node(lost)  # the node's kubelet stops reporting: an outside event
    await sim.settle()
    events = await watch_until(
        client, Workload, since, lambda _t, w: summary(cond(w, "Evicted")) == ("True", "NodeFailures")
    )
    evicted = cond(events[-1][1], "Evicted")
    assert evicted is not None
    assert evicted["message"] == (
        f"Workload eviction triggered due to multiple TAS assigned node failures, including: {lost}"
    )
    tj_events = await watch_until(client, TrainJob, since, lambda _t, t: t.spec["suspend"] is True)
    assert tj_events[-1][1].metadata.name == "nf"  # Kueue suspended the TrainJob to stop it

    sim.advance(31)
    await sim.settle()
    wl = await workload_of(client, "nf")
    assert summary(cond(wl, "Requeued")) == ("True", "NodeFailures")
    assert summary(cond(wl, "Admitted")) == ("True", "Admitted")
    assert wl.status["schedulingStats"]["evictions"] == [
        {"reason": "NodeFailures", "underlyingCause": "", "count": 1}
    ]
    assert (await client.get(TrainJob, "nf", namespace=NS)).spec["suspend"] is False
    (again,) = await job_pods(client, "nf")
    assert again.metadata.name != pod.metadata.name
    assert again.spec.nodeName != lost  # the lost node is tainted
    assert again.status.phase == "Running"
    no_controller_errors(sim)


async def test_admission_check_pending_ready_retry(sim: Simulator, client: AsyncClient) -> None:
    await install_admission_check(client)
    await sim.settle()
    await client.create(trainjob("ac", labels=QUEUE))
    await sim.settle()
    wl = await workload_of(client, "ac")
    assert summary(cond(wl, "QuotaReserved")) == ("True", "QuotaReserved")
    assert summary(cond(wl, "Admitted")) == ("False", "UnsatisfiedAdmissionChecks")
    assert [(c["name"], c["state"]) for c in wl.status["admissionChecks"]] == [(CHECK, "Pending")]
    assert (await client.get(TrainJob, "ac", namespace=NS)).spec["suspend"] is True
    assert await job_pods(client, "ac") == []  # the JobSet exists suspended: no pods yet

    await set_check_state(client, wl.metadata.name, "Ready", "capacity confirmed")
    await sim.settle()
    wl = await workload_of(client, "ac")
    admitted = cond(wl, "Admitted")
    assert admitted is not None
    assert (admitted["status"], admitted["message"]) == ("True", "The workload is admitted")
    assert (await client.get(TrainJob, "ac", namespace=NS)).spec["suspend"] is False
    (pod,) = await job_pods(client, "ac")
    assert pod.status.phase == "Running"
    since = wl.metadata.resourceVersion

    await set_check_state(client, wl.metadata.name, "Retry", "held by dispatch")
    await sim.settle()
    events = await watch_until(
        client, Workload, since, lambda _t, w: summary(cond(w, "Evicted")) == ("True", "AdmissionCheck")
    )
    evicted = cond(events[-1][1], "Evicted")
    assert evicted is not None
    assert (
        evicted["message"]
        == 'Evicted due to AdmissionCheck in Retry state: "dispatch-hold" (held by dispatch)'
    )
    wl = await workload_of(client, "ac")
    assert summary(cond(wl, "Requeued")) == ("True", "BackoffFinished")
    assert wl.status["schedulingStats"]["evictions"] == [
        {"reason": "AdmissionCheck", "underlyingCause": "", "count": 1}
    ]
    assert (await client.get(TrainJob, "ac", namespace=NS)).spec["suspend"] is True
    assert all(p.metadata.deletionTimestamp is not None for p in await job_pods(client, "ac"))

    sim.advance(30)
    await sim.settle()
    assert await job_pods(client, "ac") == []
    wl = await workload_of(client, "ac")
    # Quota reserved again, waiting for the check once more.
    assert summary(cond(wl, "QuotaReserved")) == ("True", "QuotaReserved")
    assert summary(cond(wl, "Admitted")) == ("False", "UnsatisfiedAdmissionChecks")
    assert [(c["name"], c["state"]) for c in wl.status["admissionChecks"]] == [(CHECK, "Pending")]
    assert (await client.get(TrainJob, "ac", namespace=NS)).spec["suspend"] is True

    await set_check_state(client, wl.metadata.name, "Ready", "capacity confirmed again")
    await sim.settle()
    assert (await client.get(TrainJob, "ac", namespace=NS)).spec["suspend"] is False
    assert [p.status.phase for p in await job_pods(client, "ac")] == ["Running"]
    no_controller_errors(sim)


async def test_admission_check_written_with_server_side_apply(sim: Simulator, client: AsyncClient) -> None:
    # Kueue's admission-check controllers apply the check state to the Workload's status (list-map by name).
    await install_admission_check(client)
    await client.create(trainjob("ssa", labels=QUEUE))
    await sim.settle()
    wl = await workload_of(client, "ssa")

    async def apply_state(state: str, message: str) -> None:
        check = {
            "name": CHECK,
            "state": state,
            "message": message,
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        body = {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "Workload",
            "metadata": {"name": wl.metadata.name, "namespace": NS},
            "status": {"admissionChecks": [check]},
        }
        await client.apply(Workload.Status(body), field_manager="dispatch-admission", force=True)
        await sim.settle()

    await apply_state("Ready", "capacity confirmed")
    got = await workload_of(client, "ssa")
    assert summary(cond(got, "Admitted")) == ("True", "Admitted")
    # Applying one field leaves Kueue's own status alone.
    assert got.status["admission"]["clusterQueue"] == "cluster-queue"
    assert summary(cond(got, "QuotaReserved")) == ("True", "QuotaReserved")
    assert [p.status.phase for p in await job_pods(client, "ssa")] == ["Running"]

    await apply_state("Retry", "node pool drained")
    got = await workload_of(client, "ssa")
    assert got.status["schedulingStats"]["evictions"] == [
        {"reason": "AdmissionCheck", "underlyingCause": "", "count": 1}
    ]
    tj = await client.get(TrainJob, "ssa", namespace=NS)
    assert tj.spec["suspend"] is True
    assert summary(cond(tj, "Suspended")) == ("True", "Suspended")
    sim.advance(30)
    await sim.settle()
    got = await workload_of(client, "ssa")
    assert [(c["name"], c["state"]) for c in got.status["admissionChecks"]] == [(CHECK, "Pending")]
    assert await job_pods(client, "ssa") == []

    await apply_state("Ready", "capacity confirmed again")
    assert summary(cond(await workload_of(client, "ssa"), "Admitted")) == ("True", "Admitted")
    assert [p.status.phase for p in await job_pods(client, "ssa")] == ["Running"]
    no_controller_errors(sim)


async def test_admission_check_retry_after_seconds(sim: Simulator, client: AsyncClient) -> None:
    await install_admission_check(client)
    await client.create(trainjob("later", labels=QUEUE))
    await sim.settle()
    wl = await workload_of(client, "later")
    await set_check_state(client, wl.metadata.name, "Ready", "ok")
    await sim.settle()
    await set_check_state(client, wl.metadata.name, "Retry", "try later", requeueAfterSeconds=60)
    await sim.settle()
    wl = await workload_of(client, "later")
    assert summary(cond(wl, "Requeued")) == ("False", "AdmissionCheck")
    assert wl.status["requeueState"]["requeueAt"] == "2026-01-01T00:01:00Z"
    assert summary(cond(wl, "QuotaReserved"))[0] == "False"  # type: ignore[index]
    sim.advance(59)
    await sim.settle()
    assert summary(cond(await workload_of(client, "later"), "QuotaReserved"))[0] == "False"  # type: ignore[index]
    sim.advance(1)
    await sim.settle()
    wl = await workload_of(client, "later")
    assert summary(cond(wl, "Requeued")) == ("True", "BackoffFinished")
    assert "requeueState" not in wl.status
    assert summary(cond(wl, "QuotaReserved")) == ("True", "QuotaReserved")
    no_controller_errors(sim)


async def test_node_loss_taint_manager_deletes_the_pod(sim: Simulator, client: AsyncClient) -> None:
    await client.create(trainjob("nl"))
    await sim.settle()
    (pod,) = await job_pods(client, "nl")
    lost = pod.spec.nodeName
    sim.actions.lose_node(lost)
    await sim.settle()
    node = await client.get(NodeJson, lost)
    ready = cond(node, "Ready")
    assert ready is not None and (ready["status"], ready["reason"]) == ("Unknown", "NodeStatusUnknown")
    assert ready["message"] == "Kubelet stopped posting node status."
    assert {(t["key"], t["effect"]) for t in node.spec["taints"]} == {
        ("node.kubernetes.io/unreachable", "NoSchedule"),
        ("node.kubernetes.io/unreachable", "NoExecute"),
    }
    # The Job's pods tolerate the unreachable taint for 300 s (DefaultTolerationSeconds).
    sim.advance(299)
    await sim.settle()
    assert cond(await client.get(Pod, pod.metadata.name, namespace=NS), "DisruptionTarget") is None
    sim.advance(1)
    await sim.settle()
    got = await client.get(Pod, pod.metadata.name, namespace=NS)
    dt = cond(got, "DisruptionTarget")
    assert dt is not None
    assert (dt["status"], dt["reason"], dt["message"]) == (
        "True",
        "DeletionByTaintManager",
        "Taint manager: deleting due to NoExecute taint",
    )
    assert got.metadata.deletionTimestamp is not None
    sim.advance(30)
    await sim.settle()
    (replacement,) = await job_pods(client, "nl")
    assert replacement.metadata.name != pod.metadata.name
    assert replacement.spec.nodeName != lost
    assert replacement.status.phase == "Running"
    assert cond(await client.get(TrainJob, "nl", namespace=NS), "Failed") is None
    no_controller_errors(sim)


async def test_node_loss_from_a_behaviour_script(sim: Simulator, client: AsyncClient) -> None:
    # The pod of rank 1 takes its node down (as a hardware fault would); rank 0 is unaffected.
    await client.create(trainjob("nls", nodes=2, script="rank=1: lose-node; hang"))
    await sim.settle()
    p0, p1 = await job_pods(client, "nls")
    assert p0.metadata.annotations["batch.kubernetes.io/job-completion-index"] == "0"
    assert summary(cond(await client.get(NodeJson, p1.spec.nodeName), "Ready")) == (
        "Unknown",
        "NodeStatusUnknown",
    )
    assert summary(cond(await client.get(NodeJson, p0.spec.nodeName), "Ready")) == ("True", "KubeletReady")
    sim.advance(300)
    await sim.settle()
    dt = cond(await client.get(Pod, p1.metadata.name, namespace=NS), "DisruptionTarget")
    assert summary(dt) == ("True", "DeletionByTaintManager")
    survivor = await client.get(Pod, p0.metadata.name, namespace=NS)
    assert cond(survivor, "DisruptionTarget") is None
    assert survivor.metadata.deletionTimestamp is None and survivor.status.phase == "Running"


async def test_a_scripted_node_loss_run_by_every_rank_takes_down_one_node(
    sim: Simulator, client: AsyncClient
) -> None:
    # Every rank runs the same script: that is one node loss for the job, not one per rank (which
    # used to leave every node of the cluster NotReady after a few such jobs).
    await client.create(trainjob("nlall", nodes=2, script="lose-node; hang"))
    await sim.settle()
    pods = await job_pods(client, "nlall")
    assert len({p.spec.nodeName for p in pods}) == 2
    states = [summary(cond(await client.get(NodeJson, p.spec.nodeName), "Ready"))[0] for p in pods]  # type: ignore[index]
    assert sorted(states) == ["True", "Unknown"]
    for name in ("node-0", "node-1", "node-2", "node-3"):
        if name not in {p.spec.nodeName for p in pods}:
            assert summary(cond(await client.get(NodeJson, name), "Ready"))[0] == "True"  # type: ignore[index]
    for p in pods:
        if summary(cond(await client.get(NodeJson, p.spec.nodeName), "Ready"))[0] == "Unknown":  # type: ignore[index]
            sim.actions.restore_node(p.spec.nodeName)  # leave the module's cluster whole
    await sim.settle()


async def test_nodes_read_back_with_lightkubes_typed_node(sim: Simulator, client: AsyncClient) -> None:
    nodes = [n async for n in client.list(Node)]
    assert sorted(n.metadata.name for n in nodes) == ["node-0", "node-1", "node-2", "node-3"]
    sim.actions.lose_node("node-0")
    await sim.settle()
    ready = cond(await client.get(Node, "node-0"), "Ready")
    assert summary(ready) == ("Unknown", "NodeStatusUnknown")


async def test_pods_on_a_lost_node_turn_not_ready(sim: Simulator, client: AsyncClient) -> None:
    await client.create(trainjob("nr"))
    await sim.settle()
    (pod,) = await job_pods(client, "nr")
    assert summary(cond(pod, "Ready"))[0] == "True"  # type: ignore[index]
    sim.actions.lose_node(pod.spec.nodeName)
    await sim.settle()
    got = await client.get(Pod, pod.metadata.name, namespace=NS)
    assert got.metadata.deletionTimestamp is None  # still tolerated (300 s)
    assert summary(cond(got, "Ready"))[0] == "False"  # type: ignore[index]
    tj = await client.get(TrainJob, "nr", namespace=NS)
    assert tj.status["jobsStatus"][0]["ready"] == 0
