"""The deterministic simulation of the supervisor, as CI runs it: a few hundred seeds on ``memory``."""

from __future__ import annotations

import random
import re

import pytest

from dispatch import InvalidError, UnsupportedError
from dispatch.clock import ManualClock
from dispatch.memory import MemoryBackend
from dispatch.model import Epoch, Identity
from dispatch.simulate import T0, MemoryHarness, load_harness, main, run_seed
from dispatch.simulate_fleet import FleetHarness

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

FAULT_KINDS = {  # each injected fault kind, as a run's trace shows it hit
    "store unavailable": r"store fault: \w+ unavailable",
    "store slow": r"store fault: \w+ takes",
    "store unknown on commit": r"store fault: \w+ committed, its answer lost",
    "SQLite store": r"store: sqlite",
    "corrupt row reported": r"skipped corrupt-0: unreadable record",
    "clock skew": r"clock off by",
    "clock jump": r"clock jumps",
    "zombie woken past its lease": r"WAKES",
    "long absence, evidence gone": r"every supervisor is gone for .*\n.*preempted, then gone",
    "API latency": r"fault: .* (answers after|takes) ",
    "stale list": r"fault: stale list",
    "duplicate watch event": r"watch event of .* twice",
    "out-of-order watch event": r"watch event of .* late",
    "hold and release": r"user: release job-\d+\n",
    "resubmit": r"user: resubmit job-\d+\n",
    "purge": r"user: purged job-",
    "forget": r"user: forget orphan-0\n",
    "absent reading": r"fault: stale read shows .* absent",
    "cluster down": r"OUTAGE \(down\)",
    "partial answer": r"OUTAGE \(partial\)",
    "answer with errors": r"OUTAGE \(errors\)",
    "compute left behind, then stopped": r"slow-stop 900(.|\n)*what remains",
}


async def test_a_few_hundred_seeds_find_no_violation_and_hit_every_fault_kind() -> None:
    found = []
    unhit = dict(FAULT_KINDS)
    for seed in range(CI_SEEDS):
        result = await run_seed(seed)
        found += [f"seed {seed}: {v}" for v in result.violations]
        trace = "\n".join(result.trace) + "\n"
        for kind, shows in list(unhit.items()):
            if re.search(shows, trace):
                del unhit[kind]
    assert found == []
    assert not unhit, f"no seed of {CI_SEEDS} hit {sorted(unhit)}"


@pytest.mark.parametrize("seed", sorted(REGRESSIONS), ids=[f"seed-{s}" for s in sorted(REGRESSIONS)])
async def test_seeds_that_once_failed_pass(seed: int) -> None:
    assert (await run_seed(seed)).violations == []


@pytest.mark.parametrize("seed", sorted(FIXED), ids=[f"seed-{s}" for s in sorted(FIXED)])
async def test_seeds_that_found_supervisor_bugs_pass(seed: int) -> None:
    assert (await run_seed(seed)).violations == []


async def test_sqlite_seeds_find_no_violation() -> None:
    found = []
    for seed in range(20):
        result = await run_seed(seed, store="sqlite")
        found += [f"seed {seed}: {v}" for v in result.violations]
    assert found == []


async def test_the_invariants_catch_a_zombie_without_lease_check_or_compare_and_swap() -> None:
    # A supervisor pauses mid-step, another takes its records over and moves one on; the first wakes and
    # finishes its step. Checked, its stale writes are refused; unchecked, one of them lands, and the
    # invariants say so. (Which seed plays this out moves as the code does: the first that does.)
    for seed in range(CI_SEEDS):
        checked = await run_seed(seed)
        if not any("WAKES" in line for line in checked.trace):
            continue
        assert checked.violations == [], f"seed {seed}"
        broken = await run_seed(seed, lease_check=False)
        if broken.violations:
            return
    pytest.fail(f"no seed of {CI_SEEDS} shows a zombie's unchecked write caught by the invariants")


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


FLEET_SEEDS = 150

FLEET_KINDS = {  # what a fleet's runs must exercise, as the traces show it
    "requeued onto the other cluster": r"placed on [ab]: the first other cluster that takes it",
    "given up after waiting for capacity": r"queued without capacity for \d+ s",
    "one cluster down, the other working": r"cluster [ab]: OUTAGE",
    "a cluster passed over as unreachable": r"passed over [ab]: unreachable",
}


async def test_a_fleet_of_two_clusters_keeps_every_invariant_across_both() -> None:
    """Two memory clusters as one fleet, requeues sent elsewhere (SPEC §15): at most one live incarnation
    of a job across both clusters, no compute of two incarnations at once on the two, every invariant."""
    found = []
    unhit = dict(FLEET_KINDS)
    for seed in range(FLEET_SEEDS):
        result = await run_seed(seed, "fleet")
        found += [f"seed {seed}: {v}" for v in result.violations]
        trace = "\n".join(result.trace) + "\n"
        for kind, shows in list(unhit.items()):
            if re.search(shows, trace):
                del unhit[kind]
    assert found == []
    assert not unhit, f"no seed of {FLEET_SEEDS} hit {sorted(unhit)}"


async def test_a_fleet_seed_replays_identically() -> None:
    a, b = await run_seed(25, "fleet"), await run_seed(25, "fleet")
    assert a.trace == b.trace and a.steps == b.steps and any("placed on" in line for line in a.trace)


async def test_the_fleet_facts_see_two_incarnations_of_a_job_on_two_clusters() -> None:
    """The invariant a fleet adds can fail: incarnations 1 and 2 of one job running at once, one on each
    cluster, are two live incarnations and an overlap of compute."""
    clock = ManualClock(T0)
    harness = FleetHarness(random.Random(1), clock, [])
    spec = harness.spec("sleep 100; exit 0", 1, None)
    for name, n in (("a", 1), ("b", 2)):
        backend = MemoryBackend(cluster=harness.members[name].cluster)
        await backend.start(
            await backend.prepare(spec, Identity("job-x", Epoch(n, n - 1), "0123456789abcdef"))
        )
    await harness.advance(5.0)
    assert sorted(i.epoch.n for i in harness.live()) == [1, 2]
    assert [job for job, _ in harness.overlaps()] == ["job-x"]
