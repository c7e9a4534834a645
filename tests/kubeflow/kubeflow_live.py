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
from dispatch_kubeflow.watching import TICK_SECONDS
from kubesim.clock import ManualClock
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


class SimClock:
    """dispatch's Clock on the simulator's time, so the backend's "now" (the image pull grace period, how
    long containers have waited) is the cluster's."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim

    def now(self) -> float:
        return self.sim.clock.now()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)
        if seconds >= TICK_SECONDS:
            # A background timer (the informer's tick runs for as long as the backend is open): it waits
            # for the test to move the cluster's time, else it would move it on its own.
            done = asyncio.get_running_loop().create_future()
            assert isinstance(self.sim.clock, ManualClock)
            self.sim.clock.call_at(self.now() + seconds, lambda: done.done() or done.set_result(None))
            await done
            return
        self.sim.advance(seconds)  # the probe's window, a retry's backoff: the test waits on them


class Live:
    """One simulator and the backends opened on it."""

    def __init__(self, sim: Simulator, kc: str) -> None:
        self.sim = sim
        self.kc = kc
        self.opened: list[Backend] = []

    async def open(
        self, *, read_only: bool = False, store_id: str = "", sim_time: bool = False, **settings: Any
    ) -> Backend:
        """A backend on this simulator; ``sim_time``: its "now" is the cluster's (a reading's ages, such as
        how long containers have waited, are then the cluster's and do not move between two readings)."""
        backend = await open_backend(
            config({"kubeconfig": self.kc, **settings}, read_only=read_only, store_id=store_id),
            probe_window=0.1,
            clock=SimClock(self.sim) if sim_time else None,
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
