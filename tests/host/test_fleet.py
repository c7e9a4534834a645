"""A fleet of clusters (SPEC §15) through the public API: two memory clusters, ``a`` and ``b``, over one
store, on a manual clock (:class:`dispatch.fleet.Fleet`, its supervisor, :func:`dispatch.open_fleet`).

Placement (order, weights, a cluster refusing the spec or down), a job restricted to a cluster that is
down, requeues elsewhere (preempted; queued for want of capacity past the rule's ``after``), and through
every step at most one incarnation of a job with compute on either cluster."""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import dispatch
from dispatch import (
    Action,
    Berth,
    Cause,
    Config,
    Epoch,
    InvalidError,
    ManualClock,
    Policy,
    Rule,
    State,
    UnsupportedError,
    open_fleet,
)
from dispatch.cluster import Cluster
from dispatch.fleet import Fleet, FleetSupervisor, Member, Seat
from dispatch.fleet.supervisor import REOPEN
from dispatch.memory import MemoryBackend, MemorySettings
from dispatch.model import JobRecord, Transition
from dispatch.placement import order
from dispatch.records import MemoryStore, SqliteStore

from .helpers import SETTINGS, settle, spec

PREEMPT_ONCE = "env:DISPATCH_EPOCH=1.0: sleep 2; env:DISPATCH_EPOCH=1.0: preempt; sleep 2; exit 0"
ELSEWHERE = Policy(
    {
        Cause.PREEMPTED: Rule(Action.REQUEUE, max=2, backoff=1.0, elsewhere=True),
        Cause.NO_CAPACITY: Rule(Action.REQUEUE, max=1, backoff=1.0, elsewhere=True, after=30.0),
    }
)


class Two:
    """Two memory clusters as a fleet, and what the tests look at."""

    def __init__(
        self,
        clock: ManualClock,
        *,
        policy: Policy = ELSEWHERE,
        settings: tuple[MemorySettings, MemorySettings] = (SETTINGS, SETTINGS),
        checkpoints: tuple[str, str] = ("", ""),
        weights: dict[str, float] | None = None,
    ) -> None:
        self.clock = clock
        self.store = MemoryStore(clock)
        self.backends = {n: MemoryBackend(s, clock=clock) for n, s in zip("ab", settings, strict=True)}
        members = [
            Member(Seat(n, checkpoints=c), Cluster(self.backends[n], self.store, policy=policy, clock=clock))
            for n, c in zip("ab", checkpoints, strict=True)
        ]
        self.fleet = Fleet(members, self.store, policy=policy, clock=clock, weights=weights)
        self.most_live = 0  # the most incarnations of one job with compute at once, over every step

    def id(self, name: str) -> str:
        return self.backends[name].cluster_id

    def with_compute(self, job_id: str) -> builtins.list[str]:
        """The clusters where an incarnation of the job has compute now."""
        return [
            f"{n}:{j.identity.epoch}"
            for n, b in self.backends.items()
            for j in b.cluster.timeline.jobs.values()
            if j.identity.job_id == job_id and j.nodes
        ]

    async def drive(self, sup: FleetSupervisor, seconds: float, *jobs: str) -> None:
        """Step the supervisor and advance the clock a second at a time, counting after each step (and
        each advance) the incarnations of ``jobs`` with compute; what else waits runs in between."""
        for _ in range(int(seconds)):
            await sup.step()
            self._count(jobs)
            self.clock.advance(1.0)
            for b in self.backends.values():
                b.cluster.sync()
            self._count(jobs)
            await settle()

    def _count(self, jobs: tuple[str, ...]) -> None:
        for job in jobs:
            self.most_live = max(self.most_live, len(self.with_compute(job)))


@pytest.fixture
async def two(clock: ManualClock) -> AsyncIterator[Two]:
    t = Two(clock)
    async with t.fleet:
        yield t


def lines(history: builtins.list[Transition], what: str) -> builtins.list[Transition]:
    return [t for t in history if t.what == what]


# ------------------------------------------------------------------------------------------- placing


async def test_the_first_cluster_in_order_takes_a_job(two: Two) -> None:
    rec = await two.fleet.submit(spec(), job_id="j1")
    assert rec.cluster == two.id("a") and rec.handle is not None and rec.handle.cluster == two.id("a")
    submitted, started = (await two.fleet.history("j1"))[:2]
    assert submitted.why == "placed on a: the first that takes it"
    assert submitted.cluster == started.cluster == two.id("a")
    assert two.fleet.name_of(started.cluster) == "a"


async def test_weights_spread_the_jobs_as_the_order_says(clock: ManualClock) -> None:
    t = Two(clock, weights={"a": 1.0, "b": 3.0})
    async with t.fleet:
        placed = [await t.fleet.submit(spec("sleep 600; exit 0"), job_id=f"w{i}") for i in range(24)]
    on = {n: [r.job_id for r in placed if r.cluster == t.id(n)] for n in "ab"}
    for rec in placed:  # each where the weighted order of its first incarnation put it
        first = order(["a", "b"], {"a": 1.0, "b": 3.0}, rec.job_id, 1)[0]
        assert rec.cluster == t.id(first)
    assert on["a"] and len(on["b"]) > len(on["a"])


async def test_a_cluster_refusing_the_spec_is_passed_over_and_the_history_says_why(
    clock: ManualClock,
) -> None:
    small = MemorySettings(nodes=2, start_delay=1.0, cessation_delay=2.0)
    t = Two(clock, settings=(small, SETTINGS))
    async with t.fleet:
        rec = await t.fleet.submit(spec(nodes=3), job_id="big")
        assert rec.cluster == t.id("b")
        why = (await t.fleet.history("big"))[0].why
        assert why.startswith("placed on b: the first that takes it; passed over a: does not take this job")
        assert "the job asks for 3 nodes; this memory cluster has 2" in why
        with pytest.raises(UnsupportedError) as info:
            await t.fleet.submit(spec(nodes=5), job_id="huge")
        assert "no cluster of the fleet takes this job" in str(info.value)
        assert "a: does not take this job" in str(info.value) and "b: does not take" in str(info.value)
        assert [r.job_id for r in await t.fleet.records()] == ["big"]  # refused: nothing was written


async def test_an_unknown_cluster_name_is_refused_naming_the_fleets(two: Two) -> None:
    with pytest.raises(InvalidError) as info:
        await two.fleet.submit(spec(), job_id="x", clusters=("c",))
    assert str(info.value) == "cluster: no cluster 'c' in this fleet; it has: a, b"
    assert await two.fleet.records() == []


# ------------------------------------------------------------------------------------ a cluster down


async def test_with_a_cluster_down_new_jobs_go_to_the_other_and_its_own_wait_unchanged(two: Two) -> None:
    await two.fleet.submit(spec("sleep 20; exit 0"), job_id="old")
    sup = two.fleet.supervisor(poll=1.0)
    await two.drive(sup, 3, "old")
    before = await two.fleet.get("old")
    assert before.state is State.RUNNING and before.cluster == two.id("a")
    told = await two.fleet.history("old")

    two.backends["a"].cluster.outage(40)
    new = await two.fleet.submit(spec("sleep 3; exit 0"), job_id="new")
    assert new.cluster == two.id("b")
    assert (await two.fleet.history("new"))[0].why.startswith(
        "placed on b: the first that takes it; passed over a: unreachable"
    )
    await two.drive(sup, 30, "old", "new")
    assert (await two.fleet.get("new")).state is State.SUCCEEDED  # the other cluster went on
    during = await two.fleet.get("old")  # as last known: nothing concluded from silence
    assert (during.outcome, during.handle, during.epoch) == (before.outcome, before.handle, before.epoch)
    assert await two.fleet.history("old") == told  # (its lease is renewed: its revision moves)
    assert await two.fleet.belongs(during)  # a's (only a process on a may change it), a does not answer:
    down = two.fleet.unreachable_of(during)
    assert down is not None and "does not answer" in down.reason
    assert {r.job_id: r.outcome for r in await two.fleet.list()}["old"] == before.outcome

    await two.drive(sup, 30, "old", "new")  # a answers again: its job is read, and ends there
    after = await two.fleet.get("old")
    assert (after.state, after.epoch, after.cluster) == (State.SUCCEEDED, Epoch(), two.id("a"))
    assert two.most_live == 1


async def test_a_job_allowed_only_on_a_cluster_that_is_down_waits_for_it(two: Two) -> None:
    two.backends["a"].cluster.outage(20)
    rec = await two.fleet.submit(spec("sleep 2; exit 0"), job_id="w", clusters=("a",))
    assert (rec.state, rec.cluster, rec.clusters, rec.handle) == (State.PENDING, two.id("a"), ("a",), None)
    first = (await two.fleet.history("w"))[0]
    assert first.why.startswith("waits for a: no cluster of a takes it now (a: unreachable")
    sup = two.fleet.supervisor(poll=1.0)
    await two.drive(sup, 15, "w")
    waiting = await two.fleet.get("w")
    assert (waiting.state, waiting.handle) == (State.PENDING, None)  # never sent to b
    assert two.with_compute("w") == []
    await two.drive(sup, 25, "w")
    done = await two.fleet.get("w")
    assert (done.state, done.cluster) == (State.SUCCEEDED, two.id("a"))
    started = lines(await two.fleet.history("w"), "started")
    assert [t.cluster for t in started] == [two.id("a")]
    assert started[0].at >= rec.created_at + 20  # once a answered


# ---------------------------------------------------------------------------------- requeue elsewhere


async def test_a_preempted_job_is_requeued_onto_the_other_cluster_and_succeeds(two: Two) -> None:
    await two.fleet.submit(spec(PREEMPT_ONCE), job_id="p")
    sup = two.fleet.supervisor(poll=1.0)
    await two.drive(sup, 30, "p")
    rec = await two.fleet.get("p")
    assert (rec.state, rec.epoch, rec.cluster) == (State.SUCCEEDED, Epoch(2, 1), two.id("b"))
    history = await two.fleet.history("p")
    assert [(t.epoch, t.cluster) for t in lines(history, "started")] == [
        (Epoch(1, 0), two.id("a")),
        (Epoch(2, 1), two.id("b")),
    ]
    (requeued,) = lines(history, "requeued")
    assert "under rule preempted, on another cluster" in requeued.why
    (placed,) = lines(history, "placed")
    assert placed.cluster == two.id("b") and placed.epoch == Epoch(2, 1)
    assert placed.why.startswith(
        "placed on b: the first other cluster that takes it; passed over a: the previous incarnation "
        "ran there (requeue elsewhere)"
    )
    assert placed.why.endswith("it starts over: b does not see a's checkpoints")
    # The previous incarnation's compute was gone on a before b started the next one.
    (ceased,) = lines(history, "ceased")
    assert requeued.at <= ceased.at <= placed.at <= lines(history, "started")[1].at
    assert two.most_live == 1


async def test_watching_a_job_follows_it_to_the_cluster_it_is_requeued_onto(two: Two) -> None:
    await two.fleet.submit(spec(PREEMPT_ONCE), job_id="p")
    sup = two.fleet.supervisor(poll=1.0)
    while (await two.fleet.record("p")).epoch == Epoch():  # until the requeue, still on a
        await two.drive(sup, 1, "p")
    assert (await two.fleet.record("p")).cluster == two.id("a")
    seen: builtins.list[JobRecord] = []

    async def watch() -> None:
        async for rec in two.fleet.watch("p"):
            seen.append(rec)

    watching = asyncio.ensure_future(watch())
    try:
        await two.drive(sup, 30, "p")
        assert watching.done(), f"the watch still waits, its last record: {seen[-1:]}"
        watching.result()
    finally:
        watching.cancel()
    last = seen[-1]
    assert (last.state, last.epoch, last.cluster) == (State.SUCCEEDED, Epoch(2, 1), two.id("b"))
    assert {r.cluster for r in seen} == {two.id("a"), two.id("b")}


async def test_checkpoints_follow_between_clusters_that_see_the_same_directory(clock: ManualClock) -> None:
    t = Two(clock, checkpoints=("lab-nfs", "lab-nfs"))
    async with t.fleet:
        await t.fleet.submit(spec(PREEMPT_ONCE), job_id="p")
        await t.drive(t.fleet.supervisor(poll=1.0), 30, "p")
        (placed,) = lines(await t.fleet.history("p"), "placed")
        assert placed.why.endswith("its checkpoints follow (a and b see lab-nfs)")


async def test_a_job_queued_for_capacity_past_the_rules_after_is_placed_elsewhere(two: Two) -> None:
    # a's four nodes are taken; b's are free: the job waits on a, then is given up there and goes to b.
    await two.fleet.submit(spec("sleep 600; exit 0", nodes=4), job_id="hog", clusters=("a",))
    rec = await two.fleet.submit(spec("sleep 5; exit 0", nodes=2), job_id="q", clusters=("a", "b"))
    assert rec.cluster == two.id("a")
    sup = two.fleet.supervisor(poll=1.0)
    await two.drive(sup, 10, "q")
    queued = await two.fleet.get("q")
    assert (queued.state, queued.outcome.cause) == (State.QUEUED, Cause.NO_CAPACITY)
    await two.drive(sup, 45, "q")
    done = await two.fleet.get("q")
    assert (done.state, done.epoch, done.cluster) == (State.SUCCEEDED, Epoch(2, 1), two.id("b"))
    history = await two.fleet.history("q")
    (requeued,) = lines(history, "requeued")
    assert "1.0 given up queued/no_capacity" in requeued.why
    assert "queued without capacity for 3" in requeued.why and "on another cluster" in requeued.why
    assert [t.cluster for t in lines(history, "started")] == [two.id("a"), two.id("b")]
    assert two.most_live == 1
    assert (await two.fleet.get("hog")).cluster == two.id("a")


# ------------------------------------------------------------------------------------- the operator


async def test_every_other_operation_goes_to_the_records_own_cluster(two: Two) -> None:
    await two.fleet.submit(spec("sleep 600; exit 0"), job_id="one", clusters=("b",))
    held = await two.fleet.hold("one")
    assert held.hold_requested and held.cluster == two.id("b")
    released = await two.fleet.release("one")
    assert not released.hold_requested
    cancelled = await two.fleet.cancel("one")
    assert cancelled.cancel_requested
    sup = two.fleet.supervisor(poll=1.0)
    await two.drive(sup, 5, "one")
    assert (await two.fleet.get("one")).state is State.CANCELLED
    again = await two.fleet.resubmit("one")
    assert (again.epoch.n, again.cluster) == (2, two.id("b"))


async def test_a_cancel_while_its_cluster_is_down_is_kept_and_done_once_it_answers(two: Two) -> None:
    await two.fleet.submit(spec("sleep 600; exit 0"), job_id="one")
    two.backends["a"].cluster.outage(10)
    with pytest.raises(dispatch.UnavailableError):
        await two.fleet.cancel("one")
    rec = await two.fleet.record("one")
    assert rec.cancel_requested and not rec.outcome.terminal  # the intent, and no end concluded
    assert two.with_compute("one") == ["a:1.0"]
    await two.drive(two.fleet.supervisor(poll=1.0), 20, "one")
    done = await two.fleet.get("one")
    assert (done.state, done.cluster) == (State.CANCELLED, two.id("a"))
    assert two.with_compute("one") == []


async def test_capabilities_say_since_when_a_cluster_has_not_answered(two: Two, clock: ManualClock) -> None:
    two.backends["b"].cluster.outage(100)
    down = (await two.fleet.capabilities())["b"]
    assert isinstance(down, dispatch.Unreachable) and down.at == clock.now()
    assert "does not answer" in down.reason
    clock.advance(30)
    again = (await two.fleet.capabilities())["b"]
    assert isinstance(again, dispatch.Unreachable) and again.at == down.at  # since then, not since now
    assert await two.fleet.note("fleet/down/b") is not None  # another process says the same
    assert isinstance((await two.fleet.capabilities())["a"], dispatch.Capabilities)
    clock.advance(80)
    assert isinstance((await two.fleet.capabilities())["b"], dispatch.Capabilities)
    assert await two.fleet.note("fleet/down/b") is None


async def test_a_fleet_supervisor_of_some_clusters_leaves_the_others_and_says_which_fail(two: Two) -> None:
    sup = two.fleet.supervisor(poll=1.0, only=("b",))
    assert set(sup.supervisors) == {"b"}
    with pytest.raises(InvalidError, match="no cluster 'z' in this fleet; it has: a, b"):
        two.fleet.supervisor(only=("z",))
    await two.fleet.submit(spec(PREEMPT_ONCE), job_id="on-a", clusters=("a",))
    await two.fleet.submit(spec("sleep 2; exit 0"), job_id="on-b", clusters=("b",))
    two.backends["b"].cluster.outage(5)
    failing: builtins.list[dict[str, str]] = []

    async def on_step(report: Any) -> None:
        failing.append(dict(sup.failing))
        assert all(e.startswith("b: ") for e in report.errors)  # each error names its cluster

    start = two.clock.now()

    async def until() -> bool:
        return two.clock.now() >= start + 20

    running = asyncio.ensure_future(sup.run(until=until, on_step=on_step))
    while not running.done():
        await settle()
        two.clock.advance(1.0)
    running.result()
    assert failing[0] == {"b": "b: list: the memory cluster does not answer (outage)"}
    assert failing[-1] == {}  # b answers again
    assert (await two.fleet.get("on-b")).state is State.SUCCEEDED
    a = await two.fleet.get("on-a")  # nobody supervised a: preempted, and left so
    assert (a.state, a.outcome.cause, a.epoch) == (State.FAILED, Cause.PREEMPTED, Epoch())


# -------------------------------------------------------------------------------------- open_fleet

FLAKY: dict[str, Any] = {"down": True, "opened": 0}


async def _flaky(cfg: dispatch.AdapterConfig) -> dispatch.Backend:
    """The memory adapter, refusing to open while ``FLAKY["down"]``."""
    if FLAKY["down"]:
        raise dispatch.UnavailableError("connection refused (the test says so)")
    FLAKY["opened"] += 1
    from dispatch.memory import factory

    return await factory(cfg)


dispatch.register("fleet-flaky-test", _flaky)


async def test_open_fleet_opens_each_cluster_and_one_that_cannot_be_opened_joins_closed(
    tmp_path: Path,
) -> None:
    FLAKY["down"] = True
    store = SqliteStore(tmp_path / "records.db")
    clusters = {
        "a": Berth("memory", Config(adapter={"cluster": "fleet-open-a"}), checkpoints="nfs"),
        "b": Berth("fleet-flaky-test", Config(adapter={"cluster": "fleet-open-b"}), checkpoints="nfs"),
    }
    clock = dispatch.ManualClock(time.time())
    fleet = await open_fleet(clusters, store, policy=ELSEWHERE, clock=clock)
    async with fleet:
        a, b = fleet.members
        assert a.cluster is not None and a.seat.identity == a.cluster.cluster_id
        assert a.seat.checkpoints == "nfs" and fleet.policy == ELSEWHERE
        assert b.cluster is None and b.reopen is not None
        assert b.seat.down == "UnavailableError: connection refused (the test says so)"
        assert b.seat.down_since is not None
        caps = await fleet.capabilities()
        assert isinstance(caps["b"], dispatch.Unreachable) and caps["b"].at == b.seat.down_since
        rec = await fleet.submit(spec(), job_id="j", clusters=("a", "b"))
        assert rec.cluster == a.seat.identity
        FLAKY["down"] = False
        await fleet.open_members()  # tried again only REOPEN s after it failed, not at every submit
        assert b.cluster is None
        clock.advance(REOPEN)
        await fleet.open_members()
        assert b.cluster is not None and b.seat.down == "" and b.seat.down_since is None
        assert await fleet.note("fleet/cluster/b") == b.seat.identity
    # A later process learns b's identity from the store while b cannot be opened: its records are named.
    FLAKY["down"] = True
    later = await open_fleet(clusters, SqliteStore(tmp_path / "records.db"))
    async with later:
        assert later.members[1].cluster is None and later.members[1].seat.identity == b.seat.identity
        assert later.name_of(b.seat.identity) == "b"


@pytest.mark.parametrize(
    ("kwargs", "path", "words"),
    [
        ({"clusters": {}}, "clusters", "at least one"),
        (
            {"clusters": {"a": Berth("memory", Config(store=MemoryStore()))}},
            "clusters['a'].config.store",
            "a fleet shares one store",
        ),
        (
            {"clusters": {"a": Berth("memory", Config(policy=Policy()))}, "policy": ELSEWHERE},
            "clusters['a'].config.policy",
            "a fleet shares one policy",
        ),
        ({"clusters": {"a": Berth("memory")}, "weights": {"a": 1.0, "c": 2.0}}, "weights['c']", "no cluster"),
        ({"clusters": {"a": Berth("memory")}, "weights": {"a": 0}}, "weights['a']", "above 0"),
        (
            {"clusters": {"a": Berth("memory"), "b": Berth("memory")}, "weights": {"a": 1.0}},
            "weights['b']",
            "every cluster has one",
        ),
    ],
)
async def test_open_fleet_refuses_wrong_arguments_naming_them(
    kwargs: dict[str, Any], path: str, words: str
) -> None:
    with pytest.raises(InvalidError) as info:
        await open_fleet(store=MemoryStore(), **kwargs)
    assert info.value.path == path and words in str(info.value)
