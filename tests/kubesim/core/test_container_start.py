"""A pod is ContainerCreating before it runs (issue 24): a real TrainJob goes submitted → starting →
running, so a watcher sees its pods Pending/ContainerCreating before Running."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp

from kubesim import ManualClock, RealClock, Simulator
from kubesim.controllers.kubelet import CONTAINER_START_SECONDS, SYNC_RETRY, KubeletController
from kubesim.resources import CONFIGMAPS, JOBS, PODS

from .test_kubectl_gaps import job

JOB = job("j", "hang")


def kubelet(sim: Simulator) -> KubeletController:
    return next(c for c in sim.controllers if isinstance(c, KubeletController))


def main_state(sim: Simulator) -> tuple[str, dict[str, Any]]:
    (pod,) = sim.store.list(PODS, namespace="default", label_selector="job-name=j")[0]
    status = pod["status"]
    return status["phase"], status["containerStatuses"][0]["state"]


async def test_a_bound_pod_is_container_creating_for_the_start_time() -> None:
    async with Simulator(kueue=False) as sim:
        kubelet(sim).start_seconds = 2.0  # a test on a ManualClock opts in
        sim.store.create(JOBS, JOB)
        await sim.settle()
        phase, state = main_state(sim)
        assert phase == "Pending" and state == {"waiting": {"reason": "ContainerCreating"}}
        sim.advance(1.9)
        assert main_state(sim)[0] == "Pending"
        sim.advance(0.2)
        phase, state = main_state(sim)
        assert phase == "Running" and "running" in state


async def test_a_manual_clock_starts_containers_at_once_unless_asked() -> None:
    async with Simulator(kueue=False) as sim:
        assert isinstance(sim.clock, ManualClock)
        sim.store.create(JOBS, JOB)
        await sim.settle()
        assert main_state(sim)[0] == "Running"


async def test_at_a_running_clock_a_watcher_sees_the_pod_start() -> None:
    async with Simulator(clock=RealClock(speed=10), kueue=False) as sim:
        assert kubelet(sim).start_seconds == CONTAINER_START_SECONDS
        headers = {"Authorization": f"Bearer {sim.token('admin')}"}
        phases: list[str] = []
        async with aiohttp.ClientSession() as session:
            url = sim.url + "/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=20"
            async with session.get(url, headers=headers) as resp:
                sim.store.create(JOBS, JOB)
                async for line in resp.content:
                    phase = json.loads(line)["object"]["status"].get("phase")
                    if not phases or phases[-1] != phase:
                        phases.append(phase)
                    if phase == "Running":
                        break
        assert phases[0] == "Pending" and phases[-1] == "Running", phases
        await asyncio.sleep(0)


async def test_a_pod_whose_config_map_appears_is_container_creating_before_it_runs() -> None:
    # Both waits of a start, in the kubelet's order: the env's ConfigMap is missing
    # (CreateContainerConfigError), then, once it exists, the container is being created.
    body = job("j", "hang")
    container = body["spec"]["template"]["spec"]["containers"][0]
    container["env"].append({"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "x"}}})
    async with Simulator(kueue=False) as sim:
        kubelet(sim).start_seconds = 2.0
        sim.store.create(JOBS, body)
        await sim.settle()
        phase, state = main_state(sim)
        assert phase == "Pending" and state["waiting"]["reason"] == "CreateContainerConfigError"
        assert state["waiting"]["message"] == 'configmap "cfg" not found'
        sim.store.create(
            CONFIGMAPS,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": "cfg", "namespace": "default"},
                "data": {"x": "1"},
            },
        )
        sim.advance(SYNC_RETRY)  # the pod worker's retry
        await sim.settle()
        assert main_state(sim) == ("Pending", {"waiting": {"reason": "ContainerCreating"}})
        sim.advance(2.0)
        await sim.settle()
        phase, state = main_state(sim)
        assert phase == "Running" and "running" in state
