"""Pod logs over real HTTP: snapshot, tail, follow until the container ends, and the error answers."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError as LkApiError

from kubesim import Simulator
from kubesim.resources import PODS

from .conftest import Raw, running_pod

LOG = "/api/v1/namespaces/default/pods/{}/log"


async def test_log_snapshot_and_tail(sim: Simulator, client: AsyncClient) -> None:
    sim.store.create(PODS, running_pod("p"))
    for i in range(5):
        sim.logs.append("default", "p", "node", f"line {i}")
    lines = [ln async for ln in client.log("p", namespace="default")]
    assert lines == [f"line {i}\n" for i in range(5)]
    lines = [ln async for ln in client.log("p", namespace="default", container="node", tail_lines=2)]
    assert lines == ["line 3\n", "line 4\n"]


async def test_follow_streams_until_container_ends(sim: Simulator, client: AsyncClient) -> None:
    sim.store.create(PODS, running_pod("p"))
    sim.logs.append("default", "p", "node", "first")
    got: list[str] = []

    async def follow() -> None:
        async for ln in client.log("p", namespace="default", follow=True):
            got.append(ln)

    task = asyncio.create_task(follow())
    for _ in range(500):
        if got:
            break
        await asyncio.sleep(0.005)
    sim.logs.append("default", "p", "node", "second")
    sim.logs.close("default", "p", "node")
    await asyncio.wait_for(task, 5)
    assert got == ["first\n", "second\n"]


async def test_log_errors_like_a_real_server(sim: Simulator, raw: Raw) -> None:
    code, body, _ = await raw.request("GET", LOG.format("ghost"))
    assert code == 404 and body["message"] == 'pods "ghost" not found'
    waiting = running_pod("w")
    waiting["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ContainerCreating"}}
    sim.store.create(PODS, waiting)
    code, body, _ = await raw.request("GET", LOG.format("w"))
    assert code == 400 and body["reason"] == "BadRequest"
    assert body["message"] == 'container "node" in pod "w" is waiting to start: ContainerCreating'
    sim.store.create(PODS, running_pod("two", containers=("a", "b")))
    code, body, _ = await raw.request("GET", LOG.format("two"))
    assert (
        code == 400
        and body["message"] == "a container name must be specified for pod two, choose one of: [a b]"
    )
    code, body, _ = await raw.request("GET", LOG.format("two"), params={"container": "c"})
    assert code == 400 and body["message"] == "container c is not valid for pod two"


async def test_logs_go_with_the_pod(sim: Simulator, client: AsyncClient) -> None:
    sim.store.create(PODS, running_pod("p"))
    sim.logs.append("default", "p", "node", "x")
    sim.store.delete(PODS, "default", "p", grace_period_seconds=0)
    assert sim.logs.lines("default", "p", "node") == []
    with pytest.raises(LkApiError) as ei:
        _ = [ln async for ln in client.log("p", namespace="default")]
    assert ei.value.status.code == 404


async def test_timestamps_and_since(sim: Simulator, raw: Raw) -> None:
    sim.store.create(PODS, running_pod("p"))
    sim.logs.append("default", "p", "node", "old")
    sim.advance(100)
    sim.logs.append("default", "p", "node", "new")
    code, text, _ = await raw.request(
        "GET", LOG.format("p"), params={"sinceSeconds": "10", "timestamps": "true"}
    )
    assert code == 200 and text == "2026-01-01T00:01:40Z new\n"


async def test_unscheduled_pod_has_an_empty_log(sim: Simulator, raw: Raw) -> None:
    pod = running_pod("p")
    del pod["spec"]["nodeName"]
    sim.store.create(PODS, pod)
    code, text, _ = await raw.request("GET", LOG.format("p"))
    assert code == 200 and text == ""


async def test_image_pull_waiting_messages(sim: Simulator, raw: Raw) -> None:
    for reason, detail in (
        ("ErrImagePull", "image can't be pulled"),
        ("ImagePullBackOff", "trying and failing to pull image"),
    ):
        pod = running_pod(reason.lower())
        pod["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": reason}}
        sim.store.create(PODS, pod)
        code, body, _ = await raw.request("GET", LOG.format(reason.lower()))
        assert code == 400
        assert body["message"] == f'container "node" in pod "{reason.lower()}" is waiting to start: {detail}'


async def test_previous_instance_after_a_restart(sim: Simulator, raw: Raw) -> None:
    sim.store.create(PODS, running_pod("p"))
    code, body, _ = await raw.request("GET", LOG.format("p"), params={"previous": "true"})
    assert code == 400 and body["message"] == 'previous terminated container "node" in pod "p" not found'
    sim.logs.append("default", "p", "node", "run 1")
    sim.logs.restart("default", "p", "node")
    sim.logs.append("default", "p", "node", "run 2")

    def crashloop(o: dict[str, Any]) -> None:
        o["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "CrashLoopBackOff"}}
        o["status"]["containerStatuses"][0]["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error"}}

    sim.store.mutate(PODS, "default", "p", crashloop, status=True)
    code, text, _ = await raw.request("GET", LOG.format("p"), params={"previous": "true"})
    assert code == 200 and text == "run 1\n"
    code, text, _ = await raw.request("GET", LOG.format("p"))  # waiting again: the last run's log
    assert code == 200 and text == "run 1\n"
