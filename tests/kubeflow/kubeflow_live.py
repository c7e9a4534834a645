"""Helpers for the live kubeflow tests (watch, cessation, output): a fresh kubesim over real HTTP, a
non-restarting runtime, and a collector for watch streams."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from kubeflow_fixtures import config, install, kubeconfig, spec, torch_runtime, variant

from dispatch import Absent, Handle, JobSpec, Observation, State
from dispatch.conformance.checks import WatchCollector
from dispatch_kubeflow.backend import Backend, open_backend
from dispatch_kubeflow.naming import identity_labels
from kubesim.resources import PODS
from kubesim.sim import Simulator

RUNTIME = "no-restarts"


def no_restart_runtime() -> dict[str, Any]:
    rt = variant(torch_runtime(), RUNTIME)
    job = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    job["spec"]["backoffLimit"] = 0
    job["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    return rt


def job(script: str = "print started; hang", **kw: Any) -> JobSpec:
    return spec(RUNTIME, env={"KUBESIM_SCRIPT": script}, **kw)


class Live:
    """One simulator and the backends opened on it."""

    def __init__(self, sim: Simulator, kc: str) -> None:
        self.sim = sim
        self.kc = kc
        self.opened: list[Backend] = []

    async def open(self, *, read_only: bool = False, store_id: str = "", **settings: Any) -> Backend:
        backend = await open_backend(
            config({"kubeconfig": self.kc, **settings}, read_only=read_only, store_id=store_id),
            probe_window=0.1,
        )
        self.opened.append(backend)
        return backend

    def pods(self, handle: Handle, *, live: bool = True) -> list[dict[str, Any]]:
        selector = ",".join(f"{k}={v}" for k, v in identity_labels(handle.identity).items())
        pods = self.sim.store.list(PODS, "default", label_selector=selector)[0]
        return sorted(
            (p for p in pods if not (live and p["metadata"].get("deletionTimestamp"))),
            key=lambda p: p["metadata"]["name"],
        )

    async def settle(self) -> None:
        await self.sim.settle()
        for _ in range(5):
            await asyncio.sleep(0.005)  # real time: let the HTTP streams deliver

    async def until(
        self, done: Callable[[], bool], what: str, *, step: float = 1.0, limit: float = 600
    ) -> None:
        waited = 0.0
        while True:
            await self.settle()
            if done():
                return
            if waited >= limit:
                raise AssertionError(f"waiting for {what}: not after {waited:g} s of cluster time")
            self.sim.advance(step)
            waited += step

    async def close(self) -> None:
        for backend in self.opened:
            await backend.close()


async def live(tmp_path: Path, **sim: Any) -> AsyncIterator[Live]:
    async with Simulator(install_runtimes=False, **sim) as s:
        install(s, torch_runtime(), no_restart_runtime())
        lv = Live(s, kubeconfig(tmp_path / "kc", s.url, s.token("admin")))
        try:
            yield lv
        finally:
            await lv.close()


class Collector(WatchCollector):
    """The conformance suite's watch collector, with each incarnation's states at hand."""

    def states(self, handle: Handle) -> list[State]:
        """The states of every seen reading (an absent one has none)."""
        return [c.reading.state for c in self.of(handle) if isinstance(c.reading, Observation)]

    def absent(self, handle: Handle) -> bool:
        """Whether the last change of ``handle`` says it is gone from the cluster."""
        mine = self.of(handle)
        return bool(mine) and isinstance(mine[-1].reading, Absent)

    def last(self, handle: Handle) -> State | None:
        mine = self.of(handle)
        return mine[-1].reading.state if mine and isinstance(mine[-1].reading, Observation) else None
