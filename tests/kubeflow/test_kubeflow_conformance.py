"""The backend conformance suite (dispatch.conformance) run against the kubeflow adapter on kubesim.

Each check gets a fresh simulated cluster. The harness's runtime is the stock torch runtime made not to
restart in the cluster (pod ``restartPolicy: Never``, Job ``backoffLimit: 0``), as dispatch recommends: a
failed node fails the TrainJob at once and its pod keeps the exit code. Its pods ``hang`` until the harness
makes them exit, or disrupts them as the cluster would (the scheduler preempting, a node lost, an OOM, an
eviction). Every check runs; holds here go through spec.suspend (no queue), and
test_kubeflow_conformance_kueue runs the suite under Kueue.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from kubeflow_fixtures import config, install, kubeconfig, spec, torch_runtime, variant

from dispatch import Backend, Handle, JobSpec
from dispatch.conformance import *  # noqa: F403  (the checks: test_conformance_*)
from dispatch.conformance import BaseHarness
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.naming import identity_labels
from kubesim.resources import PODS, TRAINJOBS
from kubesim.sim import Simulator

RUNTIME = "dispatch-conformance"


def _runtime() -> dict[str, object]:
    rt = variant(torch_runtime(), RUNTIME)
    job = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    job["spec"]["backoffLimit"] = 0
    job["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    return rt


class KubeflowHarness(BaseHarness):
    name = "kubeflow"
    injects = frozenset({"succeed", "fail", "vanish", "preempt", "lose_node", "oom", "evict"})
    step = 5.0
    patience = 300.0
    lingers = True

    def __init__(self, sim: Simulator, kc: str) -> None:
        self.sim = sim
        self.kc = kc
        self.opened: list[Backend] = []

    async def open(self, *, read_only: bool = False) -> Backend:
        backend = await open_backend(config({"kubeconfig": self.kc}, read_only=read_only), probe_window=0.1)
        self.opened.append(backend)
        return backend

    def spec(self) -> JobSpec:
        return spec(RUNTIME, env={"KUBESIM_SCRIPT": "print started; hang"})

    def _pods(self, handle: Handle) -> list[str]:
        selector = ",".join(f"{k}={v}" for k, v in identity_labels(handle.identity).items())
        pods = self.sim.store.list(PODS, "default", label_selector=selector)[0]
        return sorted(p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp"))

    async def succeed(self, backend: Backend, handle: Handle) -> None:
        for pod in self._pods(handle):
            self.sim.actions.exit("default", pod, 0)
        await self.settle()

    async def fail(self, backend: Backend, handle: Handle, exit_code: int) -> None:
        self.sim.actions.exit("default", self._pods(handle)[0], exit_code)
        await self.settle()

    async def preempt(self, backend: Backend, handle: Handle) -> None:
        self.sim.actions.preempt("default", self._pods(handle)[0])
        await self.settle()

    async def lose_node(self, backend: Backend, handle: Handle) -> None:
        pod = self.sim.store.get(PODS, "default", self._pods(handle)[0])
        self.sim.actions.lose_node(pod["spec"]["nodeName"])
        self.sim.advance(301)  # the taint manager deletes the pod once its 300 s toleration runs out
        await self.settle()

    async def oom(self, backend: Backend, handle: Handle) -> None:
        self.sim.actions.oom("default", self._pods(handle)[0])
        await self.settle()

    async def evict(self, backend: Backend, handle: Handle) -> None:
        self.sim.actions.evict("default", self._pods(handle)[0])
        await self.settle()

    async def vanish(self, backend: Backend, handle: Handle) -> None:
        self.sim.store.delete(TRAINJOBS, "default", handle.ref.split("/", 1)[1])
        await self.settle()

    async def advance(self, seconds: float) -> None:
        self.sim.advance(seconds)
        await asyncio.sleep(0)

    async def settle(self) -> None:
        await self.sim.settle()
        await super().settle()

    async def close(self) -> None:  # idempotent: the suite closes the harness, then this fixture
        while self.opened:
            await self.opened.pop().close()


@pytest_asyncio.fixture
async def harness(tmp_path: Path) -> AsyncIterator[KubeflowHarness]:
    async with Simulator(install_runtimes=False) as sim:
        install(sim, torch_runtime(), _runtime())
        h = KubeflowHarness(sim, kubeconfig(tmp_path / "kc", sim.url, sim.token("admin")))
        try:
            yield h
        finally:
            await h.close()
