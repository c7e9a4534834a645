"""The supervisor's deterministic simulation on the Kubeflow adapter against kubesim, as CI runs it: a
handful of seeds (``python -m dispatch.simulate --adapter kubeflow`` runs more), and the harness's own
facts checked on a cluster where they must show."""

from __future__ import annotations

import asyncio
import random
import re
from pathlib import Path

import pytest
from kubeflow_sim_harness import KubeflowHarness

from dispatch import Epoch, Identity, ManualClock
from dispatch.simulate import T0, Faults, load_harness, main, run_seed

CI_SEEDS = 8

REGRESSIONS = {
    70: "an injected 500 hit a backend's preflight: its probe cleanup slept on the manual clock for ever",
    154: "pods' lose-node script steps lost both nodes for ever: the requeued job never found capacity",
    177: "the same after an eviction requeue, for two jobs",
    247: "a TrainJob deleted behind dispatch's back before its start was recorded, placed again: not twice",
    351: "kubesim: a container in CrashLoopBackOff woken early by another event never restarted",
}


FAULT_KINDS = {  # what the Kubeflow harness adds: a seed whose trace shows it hit, and that passes
    "Kueue": (7, r"cluster: Kueue"),
    "OnFailure in-place restarts": (0, r"[1-9] in-place restarts per job"),
    "API server restart": (24, r"cluster: the API server restarts"),
    "long absence, TrainJobs deleted unread": (5, r"every supervisor is gone for .*\n.*preempted, then gone"),
    "zombie woken past its lease": (12, r"WAKES"),
}


def _masked(trace: list[str]) -> list[str]:
    # kubesim listens on a fresh loopback port per run; errors quoting the URL differ only in it.
    return [re.sub(r"127\.0\.0\.1:\d+", "127.0.0.1:PORT", line) for line in trace]


async def test_a_handful_of_seeds_find_no_violation() -> None:
    found = []
    for seed in range(CI_SEEDS):
        result = await run_seed(seed, KubeflowHarness)
        found += [f"seed {seed}: {v}" for v in result.violations]
    assert found == []


@pytest.mark.parametrize("seed", sorted(REGRESSIONS), ids=[f"seed-{s}" for s in sorted(REGRESSIONS)])
async def test_seeds_that_once_failed_pass(seed: int) -> None:
    async with asyncio.timeout(60):  # seed 70 hung: fail instead
        assert (await run_seed(seed, KubeflowHarness)).violations == []


@pytest.mark.parametrize("kind", sorted(FAULT_KINDS))
async def test_each_fault_kind_is_hit_by_its_seed_and_holds(kind: str) -> None:
    seed, shows = FAULT_KINDS[kind]
    result = await run_seed(seed, KubeflowHarness)
    assert re.search(shows, "\n".join(result.trace)), f"seed {seed} no longer injects {kind}"
    assert result.violations == []


async def test_a_seed_replays_identically() -> None:
    a, b = await run_seed(14, KubeflowHarness), await run_seed(14, KubeflowHarness)
    assert _masked(a.trace) == _masked(b.trace) and a.steps == b.steps and len(a.trace) > 10


def test_the_adapter_name_loads_this_harness() -> None:
    assert load_harness("kubeflow") is KubeflowHarness


def test_the_command_runs_kubeflow_seeds(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(Path(__file__).resolve().parents[2])  # the repository root, where the command is run
    assert main(["--seeds", "2", "--adapter", "kubeflow"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "2 runs, 0 violations"


async def test_the_harness_sees_two_incarnations_computing_at_once() -> None:
    """The invariants' facts: live incarnations, every creation, and an overlap when a second incarnation
    of a job gets pods while the first still has them (here forced by starting both directly)."""
    clock = ManualClock(T0)
    rng = random.Random(1)
    h = KubeflowHarness(rng, clock, [])
    await h.start()
    try:
        faults = Faults(rng)
        faults.on = False
        backend = await h.open(faults, None, "test")
        spec = h.spec("hang", 1, None)
        first, second = Identity("twice", Epoch(1, 0)), Identity("twice", Epoch(2, 1))
        await backend.start(await backend.prepare(spec, first))
        await h.advance(5)
        assert h.live() == [first] and h.overlaps() == []
        await backend.start(await backend.prepare(spec, second))
        await h.advance(5)
        assert sorted(h.live(), key=str) == [first, second]
        assert h.created("twice") == [first, second]
        assert [job for job, _ in h.overlaps()] == ["twice"]
        assert "twice@1.0 and twice@2.1 had compute at once" in h.overlaps()[0][1]
        await backend.close()
    finally:
        await h.close()
