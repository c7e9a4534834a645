"""The simulated cluster end to end over real HTTP, driven by lightkube's async client."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError as LkApiError
from lightkube.resources.core_v1 import Event, Pod

from kubesim import Simulator

from .conftest import JobSet, TrainJob, Workload

NS = "default"


def body(
    name: str, *, script: str | None = None, nodes: int = 1, labels: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    trainer: dict[str, Any] = {
        "image": "registry.example.com/train:1",
        "command": ["python", "train.py"],
        "numNodes": nodes,
    }
    if script is not None:
        trainer["env"] = [{"name": "KUBESIM_SCRIPT", "value": script}]
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": NS, "labels": labels or {}},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": trainer, **spec},
    }


def cond(obj: Any, ctype: str) -> dict[str, Any] | None:
    status = obj.status if not isinstance(obj, dict) else obj.get("status")
    for c in (status or {}).get("conditions") or []:
        if c["type"] == ctype:
            return dict(c)
    return None


async def node_pods(client: AsyncClient, name: str) -> list[Pod]:
    pods = [p async for p in client.list(Pod, namespace=NS, labels={"jobset.sigs.k8s.io/jobset-name": name})]
    return sorted(pods, key=lambda p: p.metadata.annotations["batch.kubernetes.io/job-completion-index"])


async def test_success_logs_and_status(sim: Simulator, client: AsyncClient) -> None:
    await client.create(
        TrainJob(body("ok", nodes=2, script="print hi {rank}; sleep 5; print bye {rank}; exit 0"))
    )
    await sim.settle()
    js = await client.get(JobSet, "ok", namespace=NS)
    assert js.metadata.ownerReferences[0].kind == "TrainJob"
    pods = await node_pods(client, "ok")
    assert [p.status.phase for p in pods] == ["Running", "Running"]
    sim.advance(5)
    await sim.settle()
    lines = [line async for line in client.log(pods[1].metadata.name, namespace=NS, container="node")]
    assert [x.rstrip("\n") for x in lines] == ["hi 1", "bye 1"]
    assert cond(await client.get(TrainJob, "ok", namespace=NS), "Complete") is None
    sim.advance(1)  # the Job syncs its ended pods a batch period later
    await sim.settle()
    tj = await client.get(TrainJob, "ok", namespace=NS)
    done = cond(tj, "Complete")
    assert done is not None and done["reason"] == "AllJobsCompleted"


async def test_follow_logs_while_running(sim: Simulator, client: AsyncClient) -> None:
    await client.create(TrainJob(body("f", script="print one; sleep 10; print two; exit 0")))
    await sim.settle()
    (pod,) = await node_pods(client, "f")
    got: list[str] = []

    async def follow() -> None:
        async for line in client.log(pod.metadata.name, namespace=NS, container="node", follow=True):
            got.append(line.rstrip("\n"))

    task = asyncio.create_task(follow())
    for _ in range(50):
        await asyncio.sleep(0.01)
        if got:
            break
    assert got == ["one"]
    sim.advance(10)
    await asyncio.wait_for(task, 5)
    assert got == ["one", "two"]


async def test_webhook_denial_and_invalid_over_http(client: AsyncClient) -> None:
    with pytest.raises(LkApiError) as info:
        await client.create(TrainJob(body("nort") | {"spec": {"runtimeRef": {"name": "missing"}}}))
    assert info.value.status.code == 403
    assert info.value.status.message.startswith(
        'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request'
    )
    with pytest.raises(LkApiError) as info:
        await client.create(TrainJob(body("x" * 64)))
    assert info.value.status.code == 422
    assert info.value.status.reason == "Invalid"
    assert info.value.status.details.causes[0].field == "<nil>"
    reserved = body("pet")
    reserved["spec"]["trainer"]["env"] = [{"name": "PET_NNODES", "value": "3"}]
    with pytest.raises(LkApiError) as info:
        await client.create(TrainJob(reserved))
    assert info.value.status.code == 403
    assert info.value.status.message.endswith("invalid envs configured: [PET_NNODES]")


async def test_failure_seen_through_a_watch(sim: Simulator, client: AsyncClient) -> None:
    start = str(sim.store.resource_version)  # a version this server handed out (1 predates its start)
    await client.create(TrainJob(body("bad", script="print oops; exit 4")))
    await sim.settle()
    sim.advance(2000)
    await sim.settle()
    tj = await client.get(TrainJob, "bad", namespace=NS)
    failed = cond(tj, "Failed")
    assert failed is not None and failed["reason"] == "FailedJobs"
    seen: list[str] = []
    async for _, obj in client.watch(TrainJob, namespace=NS, resource_version=start):
        c = cond(obj, "Failed")
        if c is not None:
            seen.append(c["reason"])
            break
    assert seen == ["FailedJobs"]


async def test_deleted_trainjob_pods_linger(sim: Simulator, client: AsyncClient) -> None:
    await client.create(TrainJob(body("del", script="hang")))
    await sim.settle()
    await client.delete(TrainJob, "del", namespace=NS)
    await sim.settle()
    (pod,) = await node_pods(client, "del")
    assert pod.metadata.deletionTimestamp is not None
    sim.advance(30)
    await sim.settle()
    assert await node_pods(client, "del") == []
    with pytest.raises(LkApiError):
        await client.get(JobSet, "del", namespace=NS)


async def test_kueue_queue_admit_and_events(sim: Simulator, client: AsyncClient) -> None:
    await client.create(
        TrainJob(body("q", script="hang", labels={"kueue.x-k8s.io/queue-name": "user-queue"}))
    )
    await sim.settle()
    (wl,) = [w async for w in client.list(Workload, namespace=NS)]
    assert wl.metadata.name.startswith("trainjob-q-")
    assert cond(wl, "Admitted")["status"] == "True"  # type: ignore[index]
    tj = await client.get(TrainJob, "q", namespace=NS)
    assert tj.spec["suspend"] is False
    reasons = {e.reason async for e in client.list(Event, namespace=NS)}
    assert {"CreatedWorkload", "QuotaReserved", "Scheduled", "Started"} <= reasons


async def test_unschedulable_and_gated_over_http(sim: Simulator, client: AsyncClient) -> None:
    big = body("big")
    big["spec"]["trainer"]["resourcesPerNode"] = {"limits": {"nvidia.com/gpu": "8"}}
    await client.create(TrainJob(big))
    await sim.settle()
    (pod,) = await node_pods(client, "big")
    sched = cond({"status": pod.status.to_dict()}, "PodScheduled")
    assert sched is not None and sched["reason"] == "Unschedulable"
    assert sched["message"].startswith("0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")


async def test_foreground_delete_waits_for_pods(sim: Simulator, client: AsyncClient) -> None:
    from lightkube.types import CascadeType

    # The garbage collector's foreground deletion, under a Trainer that lets it finish: v2.3.0 (the
    # default) re-applies the JobSet and never does, as test_trainer_faults_http.py shows.
    sim.recreate_jobset_while_deleting = False
    await client.create(
        TrainJob(body("fg", nodes=2, script="hang", labels={"kueue.x-k8s.io/queue-name": "user-queue"}))
    )
    await sim.settle()
    assert len(await node_pods(client, "fg")) == 2
    await client.delete(TrainJob, "fg", namespace=NS, cascade=CascadeType.FOREGROUND)
    await sim.settle()
    tj = await client.get(TrainJob, "fg", namespace=NS)
    assert tj.metadata.deletionTimestamp is not None
    assert "foregroundDeletion" in tj.metadata.finalizers
    assert all(p.metadata.deletionTimestamp is not None for p in await node_pods(client, "fg"))
    sim.advance(29)
    await sim.settle()
    assert len(await node_pods(client, "fg")) == 2  # still terminating
    sim.advance(1)
    await sim.settle()
    assert await node_pods(client, "fg") == []
    with pytest.raises(LkApiError):
        await client.get(TrainJob, "fg", namespace=NS)
    assert [w async for w in client.list(Workload, namespace=NS)] == []
