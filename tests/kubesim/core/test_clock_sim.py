"""Clocks and the Simulator's control loop (settle, advance, kick) with a toy controller."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kubesim import ManualClock, RealClock, SettleError, Simulator, rfc3339
from kubesim.clock import parse_rfc3339
from kubesim.resources import CONFIGMAPS
from kubesim.store import WatchEvent

from .conftest import Raw, configmap


def test_manual_clock_fires_timers_in_time_order() -> None:
    clock = ManualClock()
    fired: list[tuple[str, float]] = []
    clock.call_at(clock.now() + 5, lambda: fired.append(("b", clock.now())))
    clock.call_at(clock.now() + 1, lambda: fired.append(("a", clock.now())))
    h = clock.call_at(clock.now() + 2, lambda: fired.append(("cancelled", clock.now())))
    h.cancel()
    clock.advance(10)
    start = 1_767_225_600.0
    assert fired == [("a", start + 1), ("b", start + 5)]
    assert clock.now() == start + 10
    with pytest.raises(ValueError):
        clock.advance(-1)


def test_rfc3339_roundtrip() -> None:
    assert rfc3339(1_767_225_600.9) == "2026-01-01T00:00:00Z"
    assert parse_rfc3339("2026-01-01T00:00:10Z") == 1_767_225_610.0
    with pytest.raises(ValueError):
        parse_rfc3339("yesterday")


async def test_real_clock_speed() -> None:
    clock = RealClock(speed=1000)
    t0 = clock.now()
    await clock.sleep(50)  # 50 simulated seconds = 0.05 s
    assert clock.now() - t0 >= 50
    with pytest.raises(ValueError):
        RealClock(0)


class Copier:
    """A toy controller: for each ConfigMap "x", keeps a ConfigMap "x-copy"; re-checks after 30 s."""

    name = "copier"

    def __init__(self) -> None:
        self.queue: list[str] = []
        self.sim: Any = None
        self.timer_fired = 0

    def attach(self, sim: Simulator) -> None:
        self.sim = sim
        sim.store.subscribe(self.on_event, rt=CONFIGMAPS)

    def on_event(self, ev: WatchEvent) -> None:
        name = ev.obj["metadata"]["name"]
        if ev.type == "ADDED" and not name.endswith("-copy"):
            self.queue.append(name)

    def pending(self) -> bool:
        return bool(self.queue)

    def run_once(self) -> bool:
        did = False
        while self.queue:
            name = self.queue.pop(0)
            self.sim.store.create(CONFIGMAPS, configmap(name + "-copy"))
            self.sim.clock.call_at(self.sim.clock.now() + 30, self.tick)
            did = True
        return did

    def tick(self) -> None:
        self.timer_fired += 1


class Forever:
    name = "forever"

    def attach(self, sim: Simulator) -> None:
        pass

    def pending(self) -> bool:
        return True

    def run_once(self) -> bool:
        return True


async def test_settle_and_advance_drive_controllers() -> None:
    copier = Copier()
    async with Simulator(controllers=[copier]) as sim:
        sim.store.create(CONFIGMAPS, configmap("a"))
        await sim.settle()
        assert sim.store.exists(CONFIGMAPS, "default", "a-copy")
        sim.advance(29)
        assert copier.timer_fired == 0
        sim.advance(1)
        assert copier.timer_fired == 1


async def test_server_runs_controllers_after_writes(raw: Raw, tmp_path: Path) -> None:
    copier = Copier()
    async with Simulator(controllers=[copier]) as sim:
        r = Raw(sim, raw.session, sim.token("admin"))
        assert (await r.request("POST", "/api/v1/namespaces/default/configmaps", configmap("a")))[0] == 201
        for _ in range(200):
            if sim.store.exists(CONFIGMAPS, "default", "a-copy"):
                break
            await asyncio.sleep(0.005)
        assert sim.store.exists(CONFIGMAPS, "default", "a-copy")


async def test_settle_gives_up_on_a_runaway_controller() -> None:
    async with Simulator(controllers=[Forever()]) as sim:
        with pytest.raises(SettleError, match="forever"):
            await sim.settle(max_rounds=10)


async def test_advance_needs_a_manual_clock(tmp_path: Path) -> None:
    sim = Simulator(controllers=[], clock=RealClock())
    with pytest.raises(TypeError):
        sim.advance(1)
    with pytest.raises(RuntimeError):
        sim.write_kubeconfig(tmp_path / "kc")  # not started


async def test_real_clock_simulator_runs_controllers_in_background() -> None:
    copier = Copier()
    async with Simulator(controllers=[copier], clock=RealClock(speed=100)) as sim:
        sim.store.create(CONFIGMAPS, configmap("a"))
        for _ in range(400):
            if sim.store.exists(CONFIGMAPS, "default", "a-copy"):
                break
            await asyncio.sleep(0.01)
        assert sim.store.exists(CONFIGMAPS, "default", "a-copy")
