"""The deterministic simulation of the supervisor, as CI runs it: a few hundred seeds on ``memory``."""

from __future__ import annotations

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


async def test_a_few_hundred_seeds_find_no_violation() -> None:
    found = []
    for seed in range(CI_SEEDS):
        result = await run_seed(seed)
        found += [f"seed {seed}: {v}" for v in result.violations]
    assert found == []


@pytest.mark.parametrize("seed", sorted(REGRESSIONS), ids=[f"seed-{s}" for s in sorted(REGRESSIONS)])
async def test_seeds_that_once_failed_pass(seed: int) -> None:
    assert (await run_seed(seed)).violations == []


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


async def test_store_faults_are_injected_and_hit() -> None:
    """Seed 0 shows both store fault kinds being hit (and, like every CI seed above, no violation)."""
    result = await run_seed(0)
    assert any("store fault unavailable" in t for t in result.trace)
    assert any("store fault unknown-on-commit" in t for t in result.trace)
    assert result.violations == []
