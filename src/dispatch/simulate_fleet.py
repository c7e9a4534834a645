"""The fleet harness of the deterministic simulation (``python -m dispatch.simulate --adapter fleet``): two
``memory`` clusters, ``a`` and ``b``, used as one fleet (SPEC §15).

Each supervisor life and the user open both clusters (:class:`~dispatch.fleet.Fleet`); the run's policy
requeues preempted, lost-node and evicted jobs ``elsewhere``, and gives up on a cluster where a job has
waited for capacity too long. Each cluster misbehaves on its own (its outages, its events), so one is
often down while the other works. The facts are the union of both clusters', plus one the clusters cannot
see alone: two incarnations of one job with compute on the two clusters at once.
"""

from __future__ import annotations

import random

from dispatch.backend import Backend
from dispatch.clock import ManualClock
from dispatch.model import Action, Cause, Identity, JobSpec, Policy, Rule
from dispatch.simulate import Crasher, Faults, FaultyBackend, MemoryHarness

__all__ = ["FleetHarness", "elsewhere"]

ELSEWHERE = (Cause.PREEMPTED, Cause.NODE_LOST, Cause.EVICTED)
"""The causes whose requeue goes to another cluster (where a rule requeues them)."""


def elsewhere(policy: Policy, rng: random.Random) -> Policy:
    """``policy`` with its requeues of :data:`ELSEWHERE` causes sent to another cluster (mostly), and a
    ``no_capacity`` rule that gives up on a cluster after a wait (often)."""
    rules = dict(policy.rules)
    for cause in ELSEWHERE:
        rule = policy.rule_for(cause) if cause in rules else None
        if rule is not None and rule.action is Action.REQUEUE and rng.random() < 0.7:
            rules[cause] = Rule(
                Action.REQUEUE,
                max=rule.max,
                backoff=rule.backoff,
                backoff_cap=rule.backoff_cap,
                elsewhere=True,
            )
    if rng.random() < 0.6:
        rules[Cause.NO_CAPACITY] = Rule(
            Action.REQUEUE,
            max=rng.randint(1, 3),
            backoff=1.0,
            elsewhere=True,
            after=rng.choice([10.0, 30.0, 60.0]),
        )
    return Policy(rules, max_requeues=policy.max_requeues)


class FleetHarness:
    """Two memory clusters as one fleet (see the module docstring)."""

    name = "fleet"
    others_stop = False
    clusters = ("a", "b")

    def __init__(self, rng: random.Random, clock: ManualClock, trace: list[str]) -> None:
        self.clock = clock
        self.trace = trace
        self.members = {
            name: MemoryHarness(rng, clock, trace, index=i + 1, label=name)
            for i, name in enumerate(self.clusters)
        }
        self.nodes = min(m.nodes for m in self.members.values())
        self.policy_rng = random.Random(repr(rng.getstate()[1][:8]))  # its own stream: see elsewhere()
        self._compute_overlaps: list[tuple[str, str]] = []
        self._overlapping: set[tuple[Identity, ...]] = set()

    def shape(self, policy: Policy) -> Policy:
        """The run's policies, their requeues sent elsewhere (:func:`elsewhere`)."""
        return elsewhere(policy, self.policy_rng)

    async def start(self) -> None:
        pass

    async def open(self, faults: Faults, crasher: Crasher | None, who: str) -> Backend:
        return await self.open_member(self.clusters[0], faults, crasher, who)

    async def open_member(self, name: str, faults: Faults, crasher: Crasher | None, who: str) -> Backend:
        return FaultyBackend(self.members[name].cluster, faults, crasher, self.trace, who)

    def spec(self, script: str, nodes: int, time_limit: int | None) -> JobSpec:
        return self.members[self.clusters[0]].spec(script, nodes, time_limit)

    async def events(self, rng: random.Random, faults: Faults) -> None:
        for member in self.members.values():
            await member.events(rng, faults)

    async def disappear(self) -> None:
        for member in self.members.values():
            await member.disappear()

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self._check_overlap()

    def live(self) -> list[Identity]:
        return [i for m in self.members.values() for i in m.live()]

    def on_cluster(self) -> set[Identity]:
        return {i for m in self.members.values() for i in m.on_cluster()}

    def with_compute(self) -> set[Identity]:
        return {i for m in self.members.values() for i in m.with_compute()}

    def created(self, job_id: str) -> list[Identity]:
        return [i for m in self.members.values() for i in m.created(job_id)]

    def overlaps(self) -> list[tuple[str, str]]:
        self._check_overlap()
        return [ov for m in self.members.values() for ov in m.overlaps()] + list(self._compute_overlaps)

    def _check_overlap(self) -> None:
        """Two incarnations of one job with compute at once, one on each cluster."""
        by_job: dict[str, list[tuple[str, Identity]]] = {}
        for name, member in self.members.items():
            for ident in member.with_compute():
                by_job.setdefault(ident.job_id, []).append((name, ident))
        for job_id, held in by_job.items():
            if len({name for name, _ in held}) > 1:
                key = tuple(sorted((i for _, i in held), key=str))
                if key not in self._overlapping:
                    self._overlapping.add(key)
                    where = ", ".join(f"{i} on {name}" for name, i in held)
                    self._compute_overlaps.append((job_id, f"compute at once on two clusters: {where}"))

    async def close(self) -> None:
        for member in self.members.values():
            await member.close()
