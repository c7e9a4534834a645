"""Honest clocks: a sped-up simulator shortens waits, not ages (issue 24; docs/kubesim.md, Clocks).

Every timestamp below is compared with the wall-clock instants the test read around the action, never
with a duration the machine must meet: on a slow machine the bounds widen, they do not fail."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from kubesim import ManualClock, RealClock, Simulator
from kubesim.clock import parse_rfc3339, stamp, unstamp
from kubesim.resources import JOBS, PODS

from .test_kubectl import KUBECTL, kubectl
from .test_kubectl_gaps import job

SPEED = 100.0


def test_real_clock_maps_simulated_instants_to_wall_instants_and_back() -> None:
    clock = RealClock(speed=5)
    before = time.time()
    now = clock.now()
    after = time.time()
    assert before - 1e-3 <= clock.wall(now) <= after + 1e-3  # "now" is now, whatever the speed
    assert clock.wall(now + 50) == pytest.approx(clock.wall(now) + 10)  # 50 simulated s pass in 10 real s
    assert clock.simulated(clock.wall(now + 123.0)) == pytest.approx(now + 123.0)
    assert (
        unstamp(clock, stamp(clock, now + 50)) <= now + 50
    )  # whole wall seconds: read back early, never late
    manual = ManualClock()
    assert manual.wall(manual.now()) == manual.now() and stamp(manual, manual.now()) == "2026-01-01T00:00:00Z"


async def until(sim: Simulator, check: Any) -> None:
    for _ in range(3000):  # bounded so a broken controller fails the test instead of hanging it
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the simulator never got there")


def seconds(age: str) -> int:
    """A kubectl age (``5s``, ``2m3s``, ``4m``) in seconds."""
    total, number = 0, ""
    for ch in age:
        if ch.isdigit():
            number += ch
        else:
            total += int(number) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[ch]
            number = ""
    return total


@pytest.mark.skipif(not KUBECTL.exists(), reason="kubectl is not installed")
async def test_at_speed_ages_and_times_are_wall_clock_true(tmp_path: Path) -> None:
    async with Simulator(clock=RealClock(speed=SPEED), tls=True) as sim:
        kc = sim.write_kubeconfig(tmp_path / "kc")
        sim_start = sim.clock.now()
        created_after = int(time.time())
        sim.store.create(JOBS, job("short", "print hi; sleep 200; exit 0"))
        created_before = time.time()
        await until(
            sim, lambda: (sim.store.get(JOBS, "default", "short").get("status") or {}).get("succeeded")
        )
        done = time.time()

        meta = sim.store.get(JOBS, "default", "short")["metadata"]
        assert created_after <= parse_rfc3339(meta["creationTimestamp"]) <= created_before
        # the container slept 200 simulated seconds; its start and finish are as far apart as real time says
        pods, _ = sim.store.list(PODS, namespace="default", label_selector="job-name=short")
        state = pods[0]["status"]["containerStatuses"][0]["state"]["terminated"]
        ran = parse_rfc3339(state["finishedAt"]) - parse_rfc3339(state["startedAt"])
        assert ran <= done - created_after + 1 < 200
        for c in sim.store.get(JOBS, "default", "short")["status"]["conditions"]:
            assert created_after <= parse_rfc3339(c["lastTransitionTime"]) <= done

        # kubectl's AGE is the real age, though the simulated clock ran SPEED times further
        await until(sim, lambda: sim.clock.now() - sim_start >= 300)
        before_get = time.time()
        code, out, err = await kubectl(kc, "get", "job", "short", "--no-headers")
        after_get = time.time()
        assert code == 0, err
        age = seconds(out.split()[-1])
        assert int(before_get - created_before) - 1 <= age <= after_get - created_after + 1
        assert age < sim.clock.now() - sim_start - 60  # not the simulated age


async def test_at_speed_a_deadline_is_simulated_time_but_its_timestamps_are_wall_time() -> None:
    async with Simulator(clock=RealClock(speed=SPEED)) as sim:
        before = int(time.time())
        late = job("late", "sleep 10000; exit 0")
        late["spec"]["activeDeadlineSeconds"] = 100
        sim.store.create(JOBS, late)
        await until(
            sim,
            lambda: any(
                c["type"] == "Failed"
                for c in (sim.store.get(JOBS, "default", "late").get("status") or {}).get("conditions") or []
            ),
        )
        after = time.time()
        status = sim.store.get(JOBS, "default", "late")["status"]
        failed = next(c for c in status["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == "DeadlineExceeded"
        # the 100 simulated seconds passed in about one real second: the timestamps say so
        assert (
            before
            <= parse_rfc3339(status["startTime"])
            <= parse_rfc3339(failed["lastTransitionTime"])
            <= after
        )
        assert (
            parse_rfc3339(failed["lastTransitionTime"]) - parse_rfc3339(status["startTime"])
            <= after - before
            < 100
        )
