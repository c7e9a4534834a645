"""The supervisor on the memory backend, through the public API (``Cluster.supervisor``), on a manual clock."""

from __future__ import annotations

import asyncio
import builtins
import itertools
from collections.abc import AsyncIterator, Mapping
from typing import Any, ClassVar

import pytest

from dispatch import DEFAULT_POLICY, InvalidError, ManualClock, OutcomeUnknownError, UnsupportedError
from dispatch.backend import Prepared, place
from dispatch.cluster import Cluster
from dispatch.memory import MemoryBackend
from dispatch.model import (
    Absent,
    Action,
    Capabilities,
    Cause,
    Change,
    Epoch,
    Handle,
    Identity,
    JobSpec,
    Observation,
    Outcome,
    PlanAction,
    Policy,
    Rule,
    Share,
    State,
    Transition,
)
from dispatch.records import MemoryStore
from dispatch.supervise import Supervisor, UnmatchedPolicy
from dispatch.supervise.leases import MEMBER_LEASE

from .helpers import SETTINGS, spec

PREEMPT_ONCE = "env:DISPATCH_EPOCH=1.0: sleep 2; env:DISPATCH_EPOCH=1.0: preempt; sleep 2; exit 0"
POLICY = Policy(
    {
        Cause.PREEMPTED: Rule(Action.REQUEUE, max=2, backoff=5.0),
        Cause.NODE_LOST: Rule(Action.REQUEUE, max=3, backoff=1.0),
        Cause.TIMEOUT: Rule(Action.REQUEUE, max=1, backoff=0.0),
        Cause.OUT_OF_MEMORY: Rule(Action.FAIL),
        Cause.EVICTED: Rule(Action.HOLD),
    }
)


async def drive(clock: ManualClock, *sups: Supervisor, seconds: float = 120.0, dt: float = 1.0) -> None:
    """Step every supervisor, then advance the clock, for ``seconds`` of simulated time."""
    t = 0.0
    while t <= seconds:
        for s in sups:
            await s.step()
        clock.advance(dt)
        t += dt


def whats(history: builtins.list[Transition]) -> builtins.list[str]:
    return [f"{t.epoch} {t.what}" for t in history]


@pytest.fixture
async def pcluster(backend: MemoryBackend, store: MemoryStore, clock: ManualClock) -> Any:
    async with Cluster(backend, store, clock=clock, policy=POLICY) as c:
        yield c


async def test_a_preempted_job_is_requeued_once_and_succeeds(
    pcluster: Cluster, backend: MemoryBackend, clock: ManualClock
) -> None:
    await pcluster.submit(spec(PREEMPT_ONCE, nodes=2), job_id="job-a")
    sup = pcluster.supervisor(poll=1.0)
    await drive(clock, sup, seconds=40)
    rec = await pcluster.store.get("job-a")
    assert (rec.state, rec.epoch) == (State.SUCCEEDED, Epoch(2, 1))
    history = await pcluster.history("job-a")
    failed = next(t for t in history if t.state is State.FAILED)
    assert (failed.cause, failed.epoch) == (Cause.PREEMPTED, Epoch(1, 0))
    requeued = next(t for t in history if t.what == "requeued")
    assert requeued.epoch == Epoch(2, 1) and requeued.actor.value == "supervisor"
    assert "rule preempted: requeue (max 2, backoff 5 s" in requeued.why
    started = [t for t in history if t.what == "started"]
    assert [t.epoch for t in started] == [Epoch(1, 0), Epoch(2, 1)]
    assert started[1].at >= requeued.at + 5.0  # the backoff
    ceased = next(t for t in history if t.what == "ceased")
    assert requeued.at <= ceased.at <= started[1].at
    assert history[-1].state is State.SUCCEEDED
    assert backend.overlaps == []
    assert rec.lease is None  # final: the lease is given back


async def test_an_oom_under_a_fail_rule_gives_up_without_a_requeue(
    pcluster: Cluster, clock: ManualClock
) -> None:
    await pcluster.submit(spec("sleep 1; rank=1: oom; sleep 5; exit 0", nodes=2), job_id="job-a")
    sup = pcluster.supervisor(poll=1.0)
    await drive(clock, sup, seconds=20)
    rec = await pcluster.store.get("job-a")
    assert (rec.state, rec.outcome.cause, rec.epoch) == (State.FAILED, Cause.OUT_OF_MEMORY, Epoch(1, 0))
    history = await pcluster.history("job-a")
    assert not any(t.what == "requeued" for t in history)
    assert history[-1].what == "gave up" and "out_of_memory: fail" in history[-1].why
    assert rec.plan is not None and rec.plan.action is PlanAction.FAIL


async def test_a_node_loss_is_requeued(pcluster: Cluster, backend: MemoryBackend, clock: ManualClock) -> None:
    rec = await pcluster.submit(spec("sleep 30; exit 0"), job_id="job-a")
    sup = pcluster.supervisor(poll=1.0)
    await drive(clock, sup, seconds=3)
    assert rec.handle is not None
    await backend.lose_node(rec.handle)
    await drive(clock, sup, seconds=60)
    rec = await pcluster.store.get("job-a")
    assert (rec.state, rec.epoch) == (State.SUCCEEDED, Epoch(2, 1))
    assert any(t.cause is Cause.NODE_LOST for t in await pcluster.history("job-a"))


async def test_the_policys_max_requeues_hold(pcluster: Cluster, clock: ManualClock) -> None:
    await pcluster.submit(spec("sleep 1; preempt"), job_id="job-a")
    sup = pcluster.supervisor(poll=1.0)
    await drive(clock, sup, seconds=120)
    rec = await pcluster.store.get("job-a")
    assert (rec.state, rec.outcome.cause, rec.epoch) == (State.FAILED, Cause.PREEMPTED, Epoch(3, 2))
    history = await pcluster.history("job-a")
    assert [t.epoch for t in history if t.what == "requeued"] == [Epoch(2, 1), Epoch(3, 2)]
    assert (
        history[-1].what == "gave up"
        and "the 2 requeue(s) allowed under rule preempted are spent" in history[-1].why
    )


async def test_a_hold_rule_stops_for_a_person(pcluster: Cluster, clock: ManualClock) -> None:
    await pcluster.submit(spec("sleep 1; evict"), job_id="job-a")
    await drive(clock, pcluster.supervisor(poll=1.0), seconds=10)
    history = await pcluster.history("job-a")
    assert history[-1].what == "held for a person"
    rec = await pcluster.store.get("job-a")
    assert (rec.state, rec.outcome.cause) == (State.FAILED, Cause.EVICTED)


async def test_the_next_incarnation_waits_for_the_previous_ones_compute(
    pcluster: Cluster, backend: MemoryBackend, clock: ManualClock
) -> None:
    """A timed-out job whose pods take 20 s to go: the requeue (backoff 0) starts only once they are gone."""
    job = JobSpec(command=("train",), env={"KUBESIM_SCRIPT": "slow-stop 20; hang"}, time_limit=5)
    await pcluster.submit(job, job_id="job-a")
    sup = pcluster.supervisor(poll=1.0)
    await drive(clock, sup, seconds=60)
    history = await pcluster.history("job-a")
    timed_out = next(t for t in history if t.cause is Cause.TIMEOUT)
    started = [t for t in history if t.what == "started"]
    assert len(started) == 2
    assert started[1].at >= timed_out.at + 20.0
    assert backend.overlaps == []


async def test_a_cancel_during_the_backoff_ends_the_job_without_a_new_incarnation(
    pcluster: Cluster, backend: MemoryBackend, clock: ManualClock
) -> None:
    slow = Policy({Cause.PREEMPTED: Rule(Action.REQUEUE, max=2, backoff=60.0)})
    await pcluster.submit(spec("sleep 1; preempt"), job_id="job-a", policy=slow)
    sup = pcluster.supervisor(poll=1.0)
    await drive(clock, sup, seconds=10)
    assert (await pcluster.store.get("job-a")).epoch == Epoch(2, 1)
    rec = await pcluster.cancel("job-a")
    await drive(clock, sup, seconds=100)
    rec = await pcluster.store.get("job-a")
    assert (rec.state, rec.outcome.cause) == (State.CANCELLED, Cause.CANCELLED)
    assert [o.handle.identity.epoch.n for o in await backend.list()] == [1]


async def test_a_change_folded_from_the_supervisors_copy_sees_a_write_made_meanwhile(
    pcluster: Cluster, backend: MemoryBackend, clock: ManualClock
) -> None:
    # A fleet member folds a watch change into the record as it last wrote it, without reading the
    # store; another process's write since (the user's cancel) must not be lost to that copy.
    await pcluster.submit(spec("sleep 30; exit 0"), job_id="job-a")
    sup = pcluster.supervisor(holder="a", lease=100.0, poll=40.0)  # one scan at 0 s, the next at 40 s
    await drive(clock, sup, seconds=5)
    assert (await pcluster.store.get("job-a")).state is State.RUNNING
    await pcluster.cancel("job-a")  # the intent recorded, and a stop that the watch reports
    await drive(clock, sup, seconds=10)  # only watch changes: no scan reads the record meanwhile
    rec = await pcluster.store.get("job-a")
    assert (rec.state, rec.outcome.cause, rec.cancel_requested) == (State.CANCELLED, Cause.CANCELLED, True)
    assert rec.lease is None and sup.leased == frozenset()  # final: let go
    assert [t.what for t in await pcluster.history("job-a")].count("cancel requested") == 1


async def test_two_supervisors_never_act_on_one_record_and_split_by_capacity(
    pcluster: Cluster, clock: ManualClock
) -> None:
    for i in range(4):
        await pcluster.submit(spec("sleep 3; exit 0"), job_id=f"job-{i}")
    a = pcluster.supervisor(holder="a", poll=1.0, capacity=2)
    b = pcluster.supervisor(holder="b", poll=1.0, capacity=2)
    await a.step()
    await b.step()
    assert len(a.leased) == 2 and len(b.leased) == 2
    assert a.leased.isdisjoint(b.leased)
    for r in await pcluster.store.list():
        assert r.lease is not None and r.lease.holder in {"a", "b"}
    await drive(clock, a, b, seconds=20)
    assert {r.state for r in await pcluster.store.list()} == {State.SUCCEEDED}


async def test_a_fleet_splits_the_jobs_by_hash_and_takes_over_a_dead_members_share(
    pcluster: Cluster, clock: ManualClock
) -> None:
    for i in range(30):
        await pcluster.submit(spec(PREEMPT_ONCE if i % 2 else "sleep 20; exit 0"), job_id=f"job-{i}")
    sups = [pcluster.supervisor(holder=h, lease=10.0, poll=1.0) for h in ("a", "b", "c")]
    await drive(clock, *sups, seconds=3)  # the first scan of "a" alone may lease all; then they rebalance
    shares = [s.leased for s in sups]
    assert all(len(x) >= 3 for x in shares), shares  # no cap: the hash splits them
    assert not (shares[0] & shares[1]) and not (shares[1] & shares[2]) and not (shares[0] & shares[2])
    assert set().union(*shares) == {f"job-{i}" for i in range(30)}
    for r in await pcluster.store.list():  # what each believes it holds is what the store says
        assert r.lease is not None and r.job_id in sups["abc".index(r.lease.holder)].leased
    alive = sups[1:]  # "a" dies without releasing anything: its share is taken over
    await drive(clock, *alive, seconds=400)
    assert {r.state for r in await pcluster.store.list()} == {State.SUCCEEDED}
    for i in range(30):  # every incarnation placed exactly once, whoever placed it
        started = [t.epoch for t in await pcluster.history(f"job-{i}") if t.what == "started"]
        assert started == ([Epoch(1, 0), Epoch(2, 1)] if i % 2 else [Epoch(1, 0)])


async def test_a_dead_supervisors_records_are_taken_over_once_its_leases_expire(
    pcluster: Cluster, clock: ManualClock
) -> None:
    await pcluster.submit(spec(PREEMPT_ONCE), job_id="job-a")
    dead = pcluster.supervisor(holder="dead", lease=30.0, poll=1.0)
    # preempted at 2 s, its pods gone at 4 s, requeue recorded, then it dies (no close)
    await drive(clock, dead, seconds=5)
    assert (await pcluster.store.get("job-a")).epoch == Epoch(2, 1)
    heir = pcluster.supervisor(holder="heir", lease=30.0, poll=1.0)
    await heir.step()
    assert heir.leased == frozenset()  # the dead one's lease is still live
    await drive(clock, heir, seconds=60)
    rec = await pcluster.store.get("job-a")
    assert (rec.state, rec.epoch) == (State.SUCCEEDED, Epoch(2, 1))
    started = [t for t in await pcluster.history("job-a") if t.what == "started"]
    assert [t.epoch for t in started] == [Epoch(1, 0), Epoch(2, 1)]  # exactly once each


async def test_close_releases_the_leases_at_once(pcluster: Cluster) -> None:
    await pcluster.submit(spec("sleep 30; exit 0"), job_id="job-a")
    a = pcluster.supervisor(holder="a", poll=1.0)
    await a.step()
    assert a.leased == {"job-a"}
    await a.close()
    b = pcluster.supervisor(holder="b", poll=1.0)
    await b.step()
    assert b.leased == {"job-a"}


@pytest.mark.parametrize("policy", list(UnmatchedPolicy))
async def test_unmatched_objects_follow_the_unmatched_policy(
    pcluster: Cluster, backend: MemoryBackend, clock: ManualClock, policy: UnmatchedPolicy
) -> None:
    stray = await place(backend, spec("sleep 30; exit 0"), Identity("stray", Epoch(3, 1)))
    sup = pcluster.supervisor(poll=1.0, resync=1.0, unmatched=policy)
    await drive(clock, sup, seconds=3)
    obs = await backend.observe(stray)
    records = {r.job_id: r for r in await pcluster.store.list()}
    if policy is UnmatchedPolicy.IGNORE:
        assert obs.state is State.RUNNING and records == {}
    elif policy is UnmatchedPolicy.DELETE:
        assert obs.state is State.CANCELLED and records == {}
    else:
        adopted = records["stray"]
        assert adopted.epoch == Epoch(3, 1) and adopted.handle == stray
        assert (await pcluster.history("stray"))[0].what == "adopted"
        await drive(clock, sup, seconds=40)
        assert (await pcluster.store.get("stray")).state is State.SUCCEEDED


def test_supervisor_options_are_checked(pcluster: Cluster) -> None:
    with pytest.raises(InvalidError, match="lease"):
        pcluster.supervisor(lease=2.0, poll=1.0)
    with pytest.raises(InvalidError, match="unmatched"):
        pcluster.supervisor(unmatched="keep")
    with pytest.raises(InvalidError, match="capacity"):
        pcluster.supervisor(capacity=0)
    with pytest.raises(InvalidError, match="policy"):
        pcluster.supervisor(policy="requeue")  # type: ignore[arg-type]
    for name in ("jobs", "exclude"):
        with pytest.raises(InvalidError) as info:
            pcluster.supervisor(**{name: "job-1"})  # a lone id would read as its characters
        assert info.value.path == name


async def test_excluded_jobs_are_left_alone(pcluster: Cluster, clock: ManualClock) -> None:
    await pcluster.submit(spec(), job_id="mine")
    await pcluster.submit(spec(), job_id="not-mine")
    before = (await pcluster.store.get("not-mine"), await pcluster.history("not-mine"))
    sup = pcluster.supervisor(exclude={"not-mine"})
    await drive(clock, sup, seconds=40)
    assert (await pcluster.store.get("mine")).state is State.SUCCEEDED
    assert "not-mine" not in sup.leased
    # Its job ran to the end on the cluster, but the supervisor neither leased nor wrote its record.
    assert (await pcluster.store.get("not-mine"), await pcluster.history("not-mine")) == before
    assert not before[0].state.terminal


class LostCreate(MemoryBackend):
    """Creates, then loses the response of the first ``n`` starts."""

    def __init__(self, *args: Any, lose: int = 1, applied: bool = True, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.lose = lose
        self.applied = applied

    async def start(self, prepared: Prepared) -> Handle:
        if self.lose > 0:
            self.lose -= 1
            if self.applied:
                await super().start(prepared)
            raise OutcomeUnknownError("the connection dropped before the response (test)")
        return await super().start(prepared)


@pytest.mark.parametrize("applied", [True, False])
async def test_a_start_whose_outcome_is_unknown_is_settled_and_placed_once(
    clock: ManualClock, store: MemoryStore, applied: bool
) -> None:
    backend = LostCreate(SETTINGS, clock=clock, lose=0, applied=applied)
    async with Cluster(backend, store, clock=clock, policy=POLICY) as c:
        await c.submit(spec(PREEMPT_ONCE), job_id="job-a")
        backend.lose = 1  # the requeue's start loses its response
        sup = c.supervisor(poll=1.0)
        await drive(clock, sup, seconds=30)
        rec = await store.get("job-a")
        assert (rec.state, rec.epoch, rec.unknown_write) == (State.SUCCEEDED, Epoch(2, 1), None)
        whats_ = [t.what for t in await c.history("job-a")]
        assert "start outcome unknown" in whats_ and "settled" in whats_
        names = [o.handle.identity for o in await backend.list()]
        assert names == [Identity("job-a", Epoch(1, 0), rec.nonce), Identity("job-a", Epoch(2, 1), rec.nonce)]


class NoWatch:
    """Only the required ``Backend`` protocol (no watcher, no cessation signal): the supervisor polls.
    Like a Kubernetes foreground deletion, a stopped object disappears once its compute is gone."""

    def __init__(self, inner: MemoryBackend) -> None:
        self.inner = inner
        self.name = inner.name
        self.cluster_id = inner.cluster_id
        self.deleted: set[str] = set()

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        return await self.inner.capabilities(spec)

    async def prepare(self, spec: JobSpec, identity: Identity, *, held: bool = False) -> Prepared:
        return await self.inner.prepare(spec, identity, held=held)

    async def start(self, prepared: Prepared) -> Handle:
        return await self.inner.start(prepared)

    async def observe(self, handle: Handle) -> Observation:
        obs = await self.inner.observe(handle)
        if handle.ref in self.deleted and await self.inner.ceased(handle):
            return Observation(handle, Outcome(State.LOST, Cause.UNKNOWN), obs.at)
        return obs

    async def stop(self, handle: Handle) -> None:
        self.deleted.add(handle.ref)
        await self.inner.stop(handle)

    async def list(self) -> builtins.list[Observation]:
        return await self.inner.list()

    async def close(self) -> None:
        await self.inner.close()


async def test_without_a_watcher_the_supervisor_polls_and_waits_until_the_old_one_is_gone(
    clock: ManualClock, store: MemoryStore
) -> None:
    inner = MemoryBackend(SETTINGS, clock=clock)
    async with Cluster(NoWatch(inner), store, clock=clock, policy=POLICY) as c:
        job = JobSpec(command=("train",), env={"KUBESIM_SCRIPT": "slow-stop 10; hang"}, time_limit=5)
        await c.submit(job, job_id="job-a")
        await drive(clock, c.supervisor(poll=1.0), seconds=40)
        history = await c.history("job-a")
        assert [t.epoch for t in history if t.what == "started"] == [Epoch(1, 0), Epoch(2, 1)]
        assert inner.overlaps == []


class StaleRead(MemoryBackend):
    """``observe`` reads the incarnation absent although the listing shows it (a stale read)."""

    stale = True

    async def observe(self, handle: Handle) -> Observation | Absent:
        obs = await super().observe(handle)
        if self.stale:
            return Absent(handle, self.cluster.clock.now())
        return obs

    def identity_of(self, obj: Mapping[str, Any]) -> Identity | None:
        return super().identity_of(obj)


async def test_one_reading_that_finds_the_job_gone_does_not_make_it_lost(
    clock: ManualClock, store: MemoryStore
) -> None:
    backend = StaleRead(SETTINGS, clock=clock)
    async with Cluster(backend, store, clock=clock, policy=POLICY) as c:
        await c.submit(spec("sleep 30; exit 0"), job_id="job-a")
        rec = await c.get("job-a")
        assert rec.state is not State.LOST
        sup = c.supervisor(poll=1.0)
        await drive(clock, sup, seconds=5)
        assert (await store.get("job-a")).state is State.RUNNING
        rec = await store.get("job-a")
        assert rec.handle is not None
        await backend.vanish(rec.handle)  # now it is really gone: the watch's deletion confirms it
        await drive(clock, sup, seconds=3)
        assert (await store.get("job-a")).state is State.LOST


async def test_run_until_finishes_and_releases(pcluster: Cluster) -> None:
    """``run`` on the system clock (the memory cluster's delays are real seconds here)."""
    await pcluster.submit(spec("exit 0"), job_id="job-a")

    async def done() -> bool:
        return (await pcluster.store.get("job-a")).plan is not None or (
            await pcluster.store.get("job-a")
        ).state is State.SUCCEEDED

    clock = pcluster.clock
    assert isinstance(clock, ManualClock)

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.001)
            clock.advance(1.0)

    ticker = asyncio.create_task(tick())
    try:
        sup = pcluster.supervisor(poll=1.0)
        await asyncio.wait_for(sup.run(until=done), 10)
    finally:
        ticker.cancel()
    rec = await pcluster.store.get("job-a")
    assert rec.state is State.SUCCEEDED and rec.lease is None


class WatchBugOnce(MemoryBackend):
    """An adapter whose first watch fails with an error of its own making (a bug, not a dropped watch)."""

    opened = 0

    def watch(self, cursor: str | None = None, *, share: Share | None = None) -> AsyncIterator[Change]:
        self.opened += 1
        return self._bug() if self.opened == 1 else super().watch(cursor, share=share)

    async def _bug(self) -> AsyncIterator[Change]:
        raise KeyError("observation")
        yield  # an async generator, as a watch is


async def test_a_watch_that_fails_unexpectedly_is_logged_and_opened_again(
    clock: ManualClock, store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    backend = WatchBugOnce(SETTINGS, clock=clock)
    async with Cluster(backend, store, clock=clock, policy=POLICY) as c:
        await c.submit(spec("exit 0"), job_id="job-a")

        async def done() -> bool:
            return backend.opened >= 2 and (await store.get("job-a")).state is State.SUCCEEDED

        async def tick() -> None:
            while True:
                await asyncio.sleep(0.001)
                clock.advance(0.1)

        ticker = asyncio.create_task(tick())
        try:
            await asyncio.wait_for(c.supervisor(poll=1.0).run(until=done), 10)
        finally:
            ticker.cancel()
    failed = [r for r in caplog.records if r.levelname == "ERROR" and "watch failed" in r.getMessage()]
    assert failed and failed[0].exc_info is not None and failed[0].exc_info[0] is KeyError


async def test_a_fleet_member_takes_from_its_kept_watch_only_the_changes_of_its_own_jobs(
    pcluster: Cluster, backend: MemoryBackend, store: MemoryStore
) -> None:
    """A fleet member's watch delivers every member's changes; its steps take only those of the jobs it
    leases or that hash to it (the others wake nobody and are read past)."""
    for i in range(20):
        await pcluster.submit(spec("exit 0"), job_id=f"job-{i}")
    await store.heartbeat(f"{backend.name}/{backend.cluster_id}", "b", 3600.0, join=True)  # a live member "b"
    clock = pcluster.clock
    assert isinstance(clock, ManualClock)
    taken = 0

    async def count(report: Any) -> None:
        nonlocal taken
        taken += report.changes

    async def done() -> bool:
        return all(r.state is State.SUCCEEDED for r in await store.list() if r.job_id in mine)

    sup = pcluster.supervisor(holder="a", lease=10.0, poll=1.0)
    await sup.step()  # the first scan: it learns the members and leases its share
    mine = set(sup.leased)
    assert 0 < len(mine) < 20

    async def tick() -> None:
        while True:
            await asyncio.sleep(0.001)
            clock.advance(0.5)

    everything: builtins.list[Change] = []  # what the watch delivers, read beside the supervisor

    async def collect() -> None:
        async for change in backend.watch(None):
            everything.append(change)

    tasks = [asyncio.create_task(tick()), asyncio.create_task(collect())]
    try:
        await asyncio.wait_for(sup.run(until=done, on_step=count), 10)
    finally:
        for t in tasks:
            t.cancel()
    theirs = [c for c in everything if c.handle.identity.job_id not in mine]
    assert theirs and 0 < taken <= len(everything) - len(theirs)


def test_keep_watching_without_a_watch_is_unsupported(store: MemoryStore, clock: ManualClock) -> None:
    class NoWatch:  # the least a backend is: no Watcher
        name = "no-watch"

    sup = Supervisor(NoWatch(), store, policy=DEFAULT_POLICY, clock=clock)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedError, match="no watch"):
        sup.keep_watching()


class CountedLists(MemoryBackend):
    """An adapter that counts the full listings asked of it (a resync is one)."""

    lists = 0

    async def list(self) -> builtins.list[Observation]:
        self.lists += 1
        return await super().list()


async def test_resyncs_come_between_nine_tenths_and_the_whole_interval_apart(
    clock: ManualClock, store: MemoryStore
) -> None:
    """Supervisors started together do not all list the cluster and the store at once: each interval
    is drawn between 90 % and 100 % of ``resync`` (never longer than asked)."""
    backends = [CountedLists(SETTINGS, clock=clock) for _ in range(8)]
    sups = [
        Supervisor(b, store, clock=clock, poll=1.0, resync=100.0, holder=f"s{i}")
        for i, b in enumerate(backends)
    ]
    at: list[list[float]] = [[] for _ in sups]
    for second in range(0, 400):
        for i, (b, s) in enumerate(zip(backends, sups, strict=True)):
            before = b.lists
            await s.step()
            if b.lists > before:
                at[i].append(float(second))
        clock.advance(1.0)
    gaps = [b - a for times in at for a, b in itertools.pairwise(times)]
    assert len(gaps) >= 8 * 3 and all(89.0 <= g <= 100.0 for g in gaps), at
    assert len({tuple(times) for times in at}) > 1, "eight supervisors, every resync at the same moments"
    for s in sups:
        await s.close()


async def test_a_supervisor_whose_cluster_does_not_answer_waits_a_poll_between_steps(
    cluster: Cluster, backend: MemoryBackend, clock: ManualClock
) -> None:
    """A listing that fails is tried again at the next poll: ``run`` did it at once, stepping without a
    pause (a busy loop, a core's worth of CPU) for as long as the cluster was down."""
    await cluster.submit(spec("sleep 600; exit 0"), job_id="j")
    backend.cluster.outage(30)
    sup = cluster.supervisor(poll=5.0)
    steps: builtins.list[float] = []

    async def on_step(report: Any) -> None:
        steps.append(clock.now())

    stop = asyncio.Event()
    task = asyncio.ensure_future(sup.run(stop=stop, on_step=on_step))
    try:
        for _ in range(40):  # time stands still: one step, then it waits for the clock
            await asyncio.sleep(0)
        assert len(steps) <= 2, f"{len(steps)} steps while no time passed"
        for _ in range(6):
            clock.advance(5.0)
            for _ in range(40):
                await asyncio.sleep(0)
        assert 6 <= len(steps) <= 14, steps  # about one a poll
    finally:
        stop.set()
        await task


async def test_a_fleet_members_scan_reads_again_a_record_another_process_wrote(
    pcluster: Cluster, store: MemoryStore, clock: ManualClock
) -> None:
    """A fleet member's scan passes by the records it leases that only wait for the cluster, as it
    knows them; a record another process wrote since (its revision moved) is read again and acted on:
    here a cancel recorded while the cluster could not be told, so no watch change comes of it."""
    for jid in ("job-a", "job-b"):
        await pcluster.submit(spec("hang"), job_id=jid)
    sup = pcluster.supervisor(holder="a", lease=100.0, poll=1.0)
    await drive(clock, sup, seconds=3)
    assert {r.state for r in await store.list()} == {State.RUNNING}
    rec = await store.get("job-a")
    await store.update(rec.replace(cancel_requested=True), expected_revision=rec.revision)
    await drive(clock, sup, seconds=10)
    assert (await store.get("job-a")).state is State.CANCELLED
    assert (await store.get("job-b")).state is State.RUNNING


class EventDuringScans(MemoryStore):
    """A store through which a test makes something happen on the cluster at the start of a fleet
    member's scan (when it asks which records it holds), or as it renews its leases."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(clock)
        self.at_scan: Any = None
        self.at_page = 1  # which call of ``held`` (a page of it) runs ``at_scan`` first
        self.pages = 0
        self.at_renewal: Any = None

    async def held(self, holder: str, *, after: str = "", limit: int | None = None) -> dict[str, int]:
        self.pages += 1
        if self.pages == self.at_page:
            hook, self.at_scan = self.at_scan, None
            if hook is not None:
                await hook()
        return await super().held(holder, after=after, limit=limit)

    async def renew_leases(self, holder: str, ttl: float, job_ids: Any, **kw: Any) -> builtins.list[Any]:
        hook, self.at_renewal = self.at_renewal, None
        if hook is not None:
            await hook()
        return await super().renew_leases(holder, ttl, job_ids, **kw)


async def _forty_leased(c: Cluster, clock: ManualClock, jobs: int = 40) -> Supervisor:
    """Forty (or ``jobs``) hanging jobs, each leased by one supervisor that keeps its watch open and has
    read it to its end (nothing pending)."""
    for i in range(jobs):
        await c.submit(spec("hang"), job_id=f"job-{i:02}")
    sup = c.supervisor(holder="a", lease=20.0, poll=1.0)
    sup.keep_watching()
    while len(sup.leased) < jobs:
        await sup.step()
        clock.advance(1.0)
    await sup.step()
    return sup


@pytest.mark.parametrize("during", ["scan", "renewals"])
async def test_a_watch_change_is_folded_between_pages_of_a_long_scan(
    clock: ManualClock, monkeypatch: pytest.MonkeyPatch, during: str
) -> None:
    """A change that comes while a supervisor works through many records (a scan of every record it
    leases; the renewal of thousands of leases) is folded between two pages of that work, in the same
    step — not once the scan is over (seconds, at 100,000 jobs)."""
    from dispatch.supervise import leases as leases_module
    from dispatch.supervise import loop as loop_module

    monkeypatch.setattr(loop_module, "PAUSE", 0.0)
    monkeypatch.setattr(leases_module, "RENEW_BATCH", 4)
    backend = MemoryBackend(SETTINGS.replace(nodes=40), clock=clock)
    store = EventDuringScans(clock)
    async with Cluster(backend, store, clock=clock, policy=POLICY) as c:
        sup = await _forty_leased(c, clock)
        clock.advance(20.0 * MEMBER_LEASE / 2)  # every lease half gone: the next scan renews all, 4 at a time
        handle = (await store.get("job-17")).handle
        assert handle is not None

        async def end_one() -> None:
            await backend.inject(handle, "exit 0")

        if during == "scan":
            store.at_scan, store.at_page = end_one, store.pages + 1
        else:
            store.at_renewal = end_one
        report = await sup.step()
        assert report.folded >= 1 and (await store.get("job-17")).state is State.SUCCEEDED
        await sup.close()


async def test_a_scan_reads_the_leases_held_in_pages_and_keeps_every_one(
    clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet member's scan reads the revisions of the leases it holds a page at a time (100,000 in
    one query held the watch's changes up for 300 ms), folding changes between pages: together the
    pages are every lease it holds — none is forgotten, a record another process wrote while the pages
    were read is read again and acted on, a change that came between two pages is folded in the same
    step, and a lease another supervisor took meanwhile is let go."""
    from dispatch.supervise import leases as leases_module
    from dispatch.supervise import loop as loop_module

    monkeypatch.setattr(loop_module, "PAUSE", 0.0)
    monkeypatch.setattr(leases_module, "HELD_BATCH", 4)
    backend = MemoryBackend(SETTINGS.replace(nodes=40), clock=clock)
    store = EventDuringScans(clock)
    async with Cluster(backend, store, clock=clock, policy=POLICY) as c:
        sup = await _forty_leased(c, clock)
        clock.advance(1.0)
        handle = (await store.get("job-17")).handle
        assert handle is not None

        async def meanwhile() -> None:
            await backend.inject(handle, "exit 0")  # a watch change, between pages
            rec = await store.get("job-30")  # another process asks for a cancel: no watch change
            await store.update(rec.replace(cancel_requested=True), expected_revision=rec.revision)
            await store.release_lease("job-35", "a")  # ... and takes job-35 (as if it had lapsed)
            await store.acquire_lease("job-35", "b", 20.0)

        pages = store.pages
        store.at_scan, store.at_page = meanwhile, pages + 3  # the third page of the next scan
        report = await sup.step()
        assert store.pages - pages == 10  # 39 leases left (job-35 taken), 4 a page
        assert report.folded >= 1 and (await store.get("job-17")).state is State.SUCCEEDED
        assert sup.leased == {f"job-{i:02}" for i in range(40)} - {"job-17", "job-35"}
        await drive(clock, sup, seconds=3)
        assert (await store.get("job-30")).state is State.CANCELLED
        lease = (await store.get("job-35")).lease
        assert lease is not None and lease.holder == "b" and "job-35" not in sup.leased
        await sup.close()


async def test_leases_renewed_in_batches_all_stay_live(
    clock: ManualClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fleet member renews the leases that are half gone a batch at a time (250 on PostgreSQL: a
    call of 1,000 held the watch's changes up for 300 ms), the soonest to end first: over several lease
    periods every lease stays its own and live, leases taken at different times included. (A member's
    lease lasts :data:`MEMBER_LEASE` leases, its membership renewed meanwhile: a step is 10 s here.)"""
    from dispatch.supervise import leases as leases_module

    class Counted(MemoryStore):
        taken = 0
        batches: ClassVar[builtins.list[int]] = []

        async def member_lease(self, group: str, job_id: str, holder: str, ttl: float) -> Any:
            self.taken += 1
            return await super().member_lease(group, job_id, holder, ttl)

        async def renew_leases(self, holder: str, ttl: float, job_ids: Any, **kw: Any) -> builtins.list[Any]:
            ids = builtins.list(job_ids)
            self.batches.append(len(ids))
            return await super().renew_leases(holder, ttl, ids, **kw)

    monkeypatch.setattr(leases_module, "RENEW_BATCH", 2)  # 40 leases of 20 s, a scan a second: 2 a call
    backend = MemoryBackend(SETTINGS.replace(nodes=40), clock=clock)
    store = Counted(clock)
    async with Cluster(backend, store, clock=clock, policy=POLICY) as c:
        for i in range(20):
            await c.submit(spec("hang"), job_id=f"job-{i:02}")
        sup = c.supervisor(holder="a", lease=20.0, poll=1.0)
        await drive(clock, sup, seconds=7)
        for i in range(20, 40):  # leased later: their leases end later
            await c.submit(spec("hang"), job_id=f"job-{i:02}")
        while len(sup.leased) < 40:
            await sup.step()
            clock.advance(1.0)
        taken = store.taken
        for _ in range(MEMBER_LEASE * 10):  # five lease periods
            await sup.step()
            clock.advance(10.0)
            records = await store.list()
            assert all(
                r.lease is not None and r.lease.holder == "a" and r.lease.expires_at > clock.now()
                for r in records
            )
        assert sup.leased == {r.job_id for r in records} and len(records) == 40
        # Every one renewed by the batches (none taken again one by one), each batch within the bound.
        assert store.taken == taken and sum(store.batches) >= 4 * 40 and max(store.batches) <= 2
        assert {r.state for r in records} == {State.RUNNING}
        await sup.close()


class CountedWrites(MemoryStore):
    """A store that counts what a supervisor writes to keep its leases."""

    renewed = 0
    taken = 0

    async def renew_leases(self, holder: str, ttl: float, job_ids: Any, **kw: Any) -> builtins.list[Any]:
        out = await super().renew_leases(holder, ttl, job_ids, **kw)
        self.renewed += len(out)
        return out

    async def member_lease(self, group: str, job_id: str, holder: str, ttl: float) -> Any:
        self.taken += 1
        return await super().member_lease(group, job_id, holder, ttl)


async def test_a_members_leases_are_kept_by_its_membership_without_rewriting_its_records(
    clock: ManualClock,
) -> None:
    """A fleet member's leases last as long as its membership: over five lease periods its keepalives
    write its membership alone — none of its forty records is rewritten, no lease renewed or taken
    again — and every lease stays its own and live. (Renewing each lease at half its time was, at
    100,000 records, 6,700 row writes a second on PostgreSQL.)"""
    backend = MemoryBackend(SETTINGS.replace(nodes=40), clock=clock)
    store = CountedWrites(clock)
    async with Cluster(backend, store, clock=clock, policy=POLICY) as c:
        sup = await _forty_leased(c, clock)
        while {r.state for r in await store.list()} != {State.RUNNING}:
            await sup.step()
            clock.advance(1.0)
        revisions = {r.job_id: r.revision for r in await store.list()}
        taken = store.taken
        for _ in range(100):
            await sup.step()
            clock.advance(1.0)
        records = await store.list()
        assert {r.job_id: r.revision for r in records} == revisions
        assert store.renewed == 0 and store.taken == taken
        assert all(
            r.lease is not None and r.lease.holder == "a" and r.lease.live(clock.now()) for r in records
        )
        assert sup.leased == set(revisions)
        await sup.close()
        assert all(r.lease is None for r in await store.list())  # given back, in the one call of leaving


async def test_a_member_whose_membership_was_ended_forgets_its_leases_and_joins_again(
    clock: ManualClock,
) -> None:
    """A member that paused past its lease finds, at its next heartbeat, that another member ended its
    membership — and with it its leases, which that member took: it forgets every one, acts on none of
    them, joins again and leases only its new share."""
    backend = MemoryBackend(SETTINGS.replace(nodes=40), clock=clock)
    store = MemoryStore(clock)
    async with Cluster(backend, store, clock=clock, policy=POLICY) as c:
        a = await _forty_leased(c, clock)
        b = c.supervisor(holder="b", lease=20.0, poll=1.0)
        await b.step()  # a member of two now; "a" still holds every lease, live
        assert b.leased == frozenset()
        clock.advance(21.0)  # "a" pauses past its membership
        await b.step()  # ends it, and a's leases with it: b's share is b's to take now
        await drive(clock, b, seconds=3)
        taken_by_b = set(b.leased)
        holders = {(await store.get(j)).lease.holder for j in taken_by_b}  # type: ignore[union-attr]
        assert taken_by_b and holders == {"b"}
        revisions = {j: (await store.get(j)).revision for j in taken_by_b}
        await a.step()  # wakes: not a member any more; it forgets, joins again
        assert a.leased.isdisjoint(taken_by_b)
        assert {j: (await store.get(j)).revision for j in taken_by_b} == revisions  # none touched by "a"
        await drive(clock, a, b, seconds=5)
        assert a.leased and a.leased.isdisjoint(b.leased) and len(a.leased | b.leased) == 40
        await a.close()
        await b.close()


async def test_a_lease_a_member_holds_without_knowing_it_is_given_back_to_the_records_owner(
    clock: ManualClock,
) -> None:
    """A take whose answer was lost leaves a lease the member does not know it holds; its membership
    would keep it for an hour, keeping the record from the member whose share it is. The scan that
    reads it gives it back, and its owner takes it (found by the fleet simulation, seed 1251)."""
    backend = MemoryBackend(SETTINGS.replace(nodes=8), clock=clock)
    store = MemoryStore(clock)
    async with Cluster(backend, store, clock=clock, policy=POLICY) as c:
        for i in range(8):
            await c.submit(spec("hang"), job_id=f"job-{i}")
        a = c.supervisor(holder="a", lease=20.0, poll=1.0)
        b = c.supervisor(holder="b", lease=20.0, poll=1.0)
        await drive(clock, a, b, seconds=3)
        group = f"{backend.name}/{backend.cluster_id}"
        jid = next(j for j in sorted(b.leased) if not Share.of("a", ("a", "b")).holds(j))
        await store.release_lease(jid, "b")
        await store.member_lease(group, jid, "a", 3600.0)  # "a" took it; the answer never came
        assert jid not in a.leased
        await a.step()
        assert (await store.get(jid)).lease is None  # given back at a's next scan
        await drive(clock, a, b, seconds=2)
        lease = (await store.get(jid)).lease
        assert lease is not None and lease.holder == "b" and jid in b.leased
        await a.close()
        await b.close()


async def test_a_change_is_folded_before_a_renewal_that_falls_due(clock: ManualClock) -> None:
    """The watch changes in hand are written before the leases that fell due meanwhile are renewed, not
    after them: renewing 100,000 leases takes seconds, and the changes would wait for all of it."""

    class Ordered(MemoryStore):
        calls: ClassVar[builtins.list[str]] = []

        async def update(self, record: Any, **kwargs: Any) -> Any:
            self.calls.append(f"update {record.job_id}")
            return await super().update(record, **kwargs)

        async def renew_leases(self, holder: str, ttl: float, job_ids: Any, **kw: Any) -> builtins.list[Any]:
            self.calls.append("renew")
            return await super().renew_leases(holder, ttl, job_ids, **kw)

    backend = MemoryBackend(SETTINGS.replace(nodes=8), clock=clock)
    store = Ordered(clock)
    async with Cluster(backend, store, clock=clock, policy=POLICY) as c:
        sup = await _forty_leased(c, clock, jobs=8)
        clock.advance(20.0 * MEMBER_LEASE / 2 + 1)  # every lease half gone: the keepalive is due
        handle = (await store.get("job-03")).handle
        assert handle is not None
        await backend.inject(handle, "exit 0")
        for _ in range(20):  # the kept watch reads it
            await asyncio.sleep(0)
        store.calls.clear()
        await sup.step()
        assert "update job-03" in store.calls and "renew" in store.calls
        renewed = store.calls.index("renew")
        assert "update job-03" in store.calls[:renewed], store.calls
        assert all(c.startswith("update") for c in store.calls[:renewed]), store.calls
        assert (await store.get("job-03")).state is State.SUCCEEDED
        await sup.close()


class CountedStoreLists(MemoryStore):
    """A store that counts the listings of every record asked of it."""

    full_lists = 0

    async def list(self, *, states: Any = None) -> Any:
        if states is None:
            self.full_lists += 1
        return await super().list(states=states)


async def test_a_fleet_members_resync_stops_leftovers_without_listing_the_store(
    clock: ManualClock, backend: MemoryBackend
) -> None:
    """A fleet member's resync reads the records it needs — those it leases, and the finished ones of
    its share whose incarnation is still live — never every record. Here another process recorded a
    job finished while its incarnation kept running (as a cancel of a start thought lost, which did take
    effect): the member lets the finished record go, no watch change comes, and its resync finds the
    live incarnation of that record and stops it, without listing the store once."""
    store = CountedStoreLists(clock)
    async with Cluster(backend, store, clock=clock, policy=POLICY) as c:
        for jid in ("job-a", "job-b"):
            await c.submit(spec("hang"), job_id=jid)
        sup = c.supervisor(holder="a", poll=1.0, resync=20.0)
        await drive(clock, sup, seconds=3)
        rec = await store.get("job-a")
        assert rec.state is State.RUNNING and rec.handle is not None
        cancelled = rec.replace(outcome=Outcome(State.CANCELLED, Cause.CANCELLED), cancel_requested=True)
        await store.update(cancelled, expected_revision=rec.revision)
        await drive(clock, sup, seconds=3)
        assert "job-a" not in sup.leased  # final: let go
        assert (await backend.observe(rec.handle)).state is State.RUNNING
        await drive(clock, sup, seconds=25)  # a resync
        assert (await backend.observe(rec.handle)).state is State.CANCELLED
        assert "stopped leftovers" in [t.what for t in await c.history("job-a")]
        assert (await store.get("job-b")).state is State.RUNNING
        assert store.full_lists == 0
        await sup.close()
