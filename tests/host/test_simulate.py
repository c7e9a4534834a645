"""The deterministic simulation of the supervisor, as CI runs it: a few hundred seeds on ``memory``."""

from __future__ import annotations

import re

import pytest

from dispatch import InvalidError, UnsupportedError
from dispatch.simulate import MemoryHarness, load_harness, main, run_seed

CI_SEEDS = 300

REGRESSIONS = {
    37: "a stale read right after submit made a running job lost (Cluster.get confirmed with a 2nd observe)",
    190: "a job vanished while another supervisor-capacity slot held it: its loss was never confirmed",
    280: "two stale reads at two steps made a running job lost (now confirmed by the identity lookup)",
    6642: "a restarted supervisor's first observe failed, and the vanished job was never observed again",
    7961: "the same, on several jobs at once after a crash",
    9662: "a job vanished right after submit, its first observation failed: never observed again",
}


FIXED = {
    60: "a supervisor whose clock jumped 20 s ahead (lease 10 s) saw its own leases expired and never acted",
    87: "the same, on a resubmitted job: it stayed starting for good",
    774: "a deletion seen on the watch after the incarnation was created again made the running job lost",
    3235: "a zombie woke and placed the incarnation its record wanted before the pause (the job was lost)",
    3863: "the same, after a requeue",
}

FAULT_KINDS = {  # each injected fault kind: a seed whose trace shows it hit, and that passes
    "store unavailable": (2, r"store fault: \w+ unavailable"),
    "store slow": (3, r"store fault: \w+ takes"),
    "store unknown on commit": (7, r"store fault: \w+ committed, its answer lost"),
    "SQLite store": (4, r"store: sqlite"),
    "corrupt row reported": (4, r"skipped corrupt-0: unreadable record"),
    "clock skew": (0, r"clock off by"),
    "clock jump": (1, r"clock jumps"),
    "zombie woken past its lease": (8, r"WAKES"),
    "long absence, evidence gone": (5, r"every supervisor is gone for .*\n.*preempted, then gone"),
    "API latency": (0, r"fault: .* (answers after|takes) "),
    "stale list": (0, r"fault: stale list"),
    "duplicate watch event": (0, r"watch event of .* twice"),
    "out-of-order watch event": (0, r"watch event of .* late"),
    "hold and release": (8, r"user: release job-\d+\n"),
    "resubmit": (8, r"user: resubmit job-\d+\n"),
    "purge": (18, r"user: purged job-"),
    "forget": (1, r"user: forget orphan-0\n"),
}


async def test_a_few_hundred_seeds_find_no_violation() -> None:
    found = []
    for seed in range(CI_SEEDS):
        result = await run_seed(seed)
        found += [f"seed {seed}: {v}" for v in result.violations]
    assert found == []


@pytest.mark.parametrize("seed", sorted(REGRESSIONS), ids=[f"seed-{s}" for s in sorted(REGRESSIONS)])
async def test_seeds_that_once_failed_pass(seed: int) -> None:
    assert (await run_seed(seed)).violations == []


@pytest.mark.parametrize("seed", sorted(FIXED), ids=[f"seed-{s}" for s in sorted(FIXED)])
async def test_seeds_that_found_supervisor_bugs_pass(seed: int) -> None:
    assert (await run_seed(seed)).violations == []


@pytest.mark.parametrize("kind", sorted(FAULT_KINDS))
async def test_each_fault_kind_is_hit_by_its_seed_and_holds(kind: str) -> None:
    seed, shows = FAULT_KINDS[kind]
    result = await run_seed(seed)
    assert re.search(shows, "\n".join(result.trace) + "\n"), f"seed {seed} no longer injects {kind}"
    assert result.violations == []


async def test_sqlite_seeds_find_no_violation() -> None:
    found = []
    for seed in range(20):
        result = await run_seed(seed, store="sqlite")
        found += [f"seed {seed}: {v}" for v in result.violations]
    assert found == []


async def test_the_invariants_catch_a_zombie_without_lease_check_or_compare_and_swap() -> None:
    # Seed 36: a supervisor pauses mid-step, another takes its records over and the user cancels one;
    # the first wakes and finishes its step. Checked, its stale writes are refused; unchecked, one lands.
    checked = await run_seed(36)
    assert any("WAKES" in line for line in checked.trace) and checked.violations == []
    broken = await run_seed(36, lease_check=False)
    assert any("history says cancelled" in v for v in broken.violations)


async def test_a_seed_replays_identically() -> None:
    a, b = await run_seed(11), await run_seed(11)
    assert a.trace == b.trace and a.steps == b.steps and len(a.trace) > 10


def test_the_command_ends_with_the_summary_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seeds", "3", "--first", "5"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "3 runs, 0 violations"


def test_a_harness_is_named_by_adapter_or_module_attr() -> None:
    assert load_harness("memory") is MemoryHarness
    assert load_harness("dispatch.simulate:MemoryHarness") is MemoryHarness


@pytest.mark.parametrize(
    ("name", "error", "says"),
    [
        ("nonsense", InvalidError, "module:attr"),
        ("dispatch.simulate:nothing_here", InvalidError, "no harness 'nothing_here'"),
        ("no_such_harness_module:H", UnsupportedError, "not importable"),
    ],
)
def test_a_wrong_harness_is_a_clear_error(name: str, error: type[Exception], says: str) -> None:
    with pytest.raises(error, match=says):
        load_harness(name)


def test_the_command_refuses_a_wrong_harness(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seeds", "1", "--harness", "no_such_harness_module:H"]) == 2
    assert "not importable" in capsys.readouterr().err
