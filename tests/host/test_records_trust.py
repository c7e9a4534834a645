"""Records you can trust (SPEC §6.1, §2.6, §7): a record belongs to its cluster, budgets are per rule,
what was seen is kept in the record, and one unreadable record never stops the others.

Through the public API on the memory adapter and real stores (MemoryStore, SqliteStore)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dispatch import ManualClock, OtherClusterError
from dispatch.cluster import Cluster
from dispatch.fold import fold
from dispatch.memory import MemoryBackend
from dispatch.model import (
    Action,
    Cause,
    Epoch,
    Evidence,
    Handle,
    Identity,
    JobRecord,
    Observation,
    Outcome,
    Policy,
    Rule,
    State,
)
from dispatch.records import MemoryStore, SqliteStore
from dispatch.supervise import UnmatchedPolicy

from .helpers import SETTINGS, spec
from .test_supervise import drive

# Preempted at incarnations 1 and 2, then exit code 3 at every later one.
TWO_PREEMPTIONS_THEN_EXIT_3 = (
    "sleep 1; env:DISPATCH_EPOCH=1.0: preempt; env:DISPATCH_EPOCH=2.1: preempt; sleep 1; exit 3"
)


async def test_each_rule_has_its_own_budget(store: MemoryStore, clock: ManualClock) -> None:
    policy = Policy(
        {
            Cause.PREEMPTED: Rule(Action.REQUEUE, max=3, backoff=1.0),
            Cause.EXIT_CODE: Rule(Action.REQUEUE, max=1, backoff=1.0),
        }
    )
    backend = MemoryBackend(SETTINGS, clock=clock)
    cluster = Cluster(backend, store, clock=clock, policy=policy)  # not closed: the store outlives it
    await cluster.submit(spec(TWO_PREEMPTIONS_THEN_EXIT_3), job_id="budget")
    await drive(clock, cluster.supervisor(poll=1.0), seconds=120)
    rec = await cluster.get("budget")
    # Two preemptions and then one exit code were requeued; the second exit code fails the job.
    assert (rec.state, rec.outcome.cause, rec.epoch) == (State.FAILED, Cause.EXIT_CODE, Epoch(4, 3))
    assert dict(rec.requeues) == {"preempted": 2, "exit_code": 1}
    history = await cluster.history("budget")
    requeues = [t.why for t in history if t.what == "requeued"]
    assert len(requeues) == 3
    assert "requeue 1 of 3 under rule preempted" in requeues[0]
    assert "requeue 2 of 3 under rule preempted" in requeues[1]
    assert "requeue 1 of 1 under rule exit_code" in requeues[2]
    assert history[-1].what == "gave up"
    assert "the 1 requeue(s) allowed under rule exit_code are spent" in history[-1].why


async def test_the_policy_wide_cap_counts_every_rule(store: MemoryStore, clock: ManualClock) -> None:
    policy = Policy(
        {
            Cause.PREEMPTED: Rule(Action.REQUEUE, max=3, backoff=1.0),
            Cause.EXIT_CODE: Rule(Action.REQUEUE, max=3, backoff=1.0),
        },
        max_requeues=2,
    )
    cluster = Cluster(
        MemoryBackend(SETTINGS, clock=clock), store, clock=clock, policy=policy
    )  # not closed: the store outlives it
    await cluster.submit(spec(TWO_PREEMPTIONS_THEN_EXIT_3), job_id="cap")
    await drive(clock, cluster.supervisor(poll=1.0), seconds=120)
    rec = await cluster.get("cap")
    assert (rec.state, rec.outcome.cause, rec.epoch) == (State.FAILED, Cause.EXIT_CODE, Epoch(3, 2))
    history = await cluster.history("cap")
    assert "maxRequeues" in history[-1].why


async def test_a_record_is_changed_only_from_its_own_cluster(store: MemoryStore, clock: ManualClock) -> None:
    mine = MemoryBackend(SETTINGS, clock=clock)
    other = MemoryBackend(SETTINGS, clock=clock)  # another cluster, the same store
    assert mine.cluster_id != other.cluster_id
    home = Cluster(mine, store, clock=clock)  # not closed: the store outlives it
    await home.submit(spec("sleep 30; exit 0"), job_id="home")
    placed = await store.get("home")
    assert placed.cluster == mine.cluster_id and placed.handle is not None
    assert placed.handle.cluster == mine.cluster_id
    away = Cluster(other, store, clock=clock)  # not closed: the store outlives it
    # Read from the other cluster: shown as last known, never refreshed to "lost", nothing written.
    got = await away.get("home")
    assert (got.state, got.revision) == (placed.state, placed.revision)
    assert [r.revision for r in await away.list()] == [placed.revision]
    assert [r.revision async for r in away.watch("home")] == [placed.revision]
    for write in (away.cancel, away.hold, away.release):
        with pytest.raises(OtherClusterError, match="not this one"):
            await write("home")
    # Its supervisor neither leases nor folds it, even after the record's lease time.
    sup = away.supervisor(poll=1.0, unmatched=UnmatchedPolicy.DELETE)
    await drive(clock, sup, seconds=10)
    after = await store.get("home")
    assert (after.revision, after.lease) == (placed.revision, None)
    home = Cluster(mine, store, clock=clock)  # not closed: the store outlives it
    clock.advance(40)
    assert (await home.get("home")).state is State.SUCCEEDED  # its own cluster still answers


async def test_forget_ends_a_record_whose_cluster_is_gone(store: MemoryStore, clock: ManualClock) -> None:
    gone = MemoryBackend(SETTINGS, clock=clock)
    old = Cluster(gone, store, clock=clock)  # not closed: the store outlives it
    await old.submit(spec("sleep 30; exit 0"), job_id="orphan")
    with pytest.raises(Exception, match="belongs to this cluster"):
        await old.forget("orphan", "the dev cluster was stopped")
    new = Cluster(
        MemoryBackend(SETTINGS, clock=clock), store, clock=clock
    )  # not closed: the store outlives it
    rec = await new.forget("orphan", "the dev cluster was stopped")
    assert (rec.state, rec.outcome.cause) == (State.LOST, Cause.UNKNOWN)
    last = (await new.history("orphan"))[-1]
    assert (last.actor.value, last.what, last.why) == ("user", "forgotten", "the dev cluster was stopped")
    # Final: no supervisor requeues it, whatever the policy says of its cause.
    sup = new.supervisor(poll=1.0)
    await drive(clock, sup, seconds=5)
    assert (await store.get("orphan")).epoch == Epoch(1, 0)
    clock.advance(3600)
    assert await new.purge(clock.now()) == 1


async def test_two_stores_on_one_cluster_leave_each_others_objects_alone(clock: ManualClock) -> None:
    first, second = MemoryStore(clock), MemoryStore(clock)
    shared = MemoryBackend(SETTINGS, clock=clock, store_id="first")
    a = Cluster(shared, first, clock=clock)  # not closed: the store outlives it
    await a.submit(spec("sleep 30; exit 0"), job_id="a-job")
    view = MemoryBackend(cluster=shared.cluster, store_id="second")
    assert await view.list() == []
    b = Cluster(view, second, clock=clock)  # not closed: the store outlives it
    await drive(clock, b.supervisor(poll=1.0, unmatched=UnmatchedPolicy.ADOPT), seconds=3)
    assert await second.list() == []  # nothing adopted from the other store
    assert [o.handle.identity.job_id for o in await shared.list()] == ["a-job"]


def test_a_fresh_process_reads_the_cause_the_record_kept() -> None:
    """The cause seen while a container restarted is in the record: a later ``failed``/``unknown``
    reading (the pods are gone) fails of that cause, whichever process reads it."""
    ident = Identity("oomed", Epoch())
    handle = Handle("memory", ident, "oomed-1", cluster="memory:x")
    oom = Evidence(kind="Pod", name="oomed-node-0", reason="OOMKilled", exit_code=137)
    rec = JobRecord(
        job_id="oomed",
        spec=spec("sleep 1"),
        created_at=0.0,
        updated_at=0.0,
        handle=handle,
        outcome=Outcome(State.RUNNING, Cause.OUT_OF_MEMORY, (oom,)),
        cluster="memory:x",
    )
    gone = Evidence(kind="TrainJob", name="oomed-1", reason="FailedJobs")
    new, transitions = fold(
        rec, Observation(handle, Outcome(State.FAILED, Cause.UNKNOWN, (gone,)), 5.0), now=5.0
    )
    assert (new.state, new.outcome.cause) == (State.FAILED, Cause.OUT_OF_MEMORY)
    assert new.outcome.evidence == (oom, gone)
    assert transitions[-1].cause is Cause.OUT_OF_MEMORY


async def test_one_unreadable_record_never_stops_the_others(tmp_path: Path, clock: ManualClock) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path, clock=clock)
    backend = MemoryBackend(SETTINGS, clock=clock)
    cluster = Cluster(backend, store, clock=clock)  # not closed: the store outlives it
    for job in ("corrupt", "healthy"):
        await cluster.submit(spec("sleep 2; exit 0"), job_id=job)
    foreign = MemoryStore(clock)
    elsewhere = Cluster(
        MemoryBackend(SETTINGS, clock=clock), foreign, clock=clock
    )  # not closed: the store outlives it
    await elsewhere.submit(spec("sleep 2; exit 0"), job_id="foreign")
    alien = (await foreign.get("foreign")).replace(
        handle=Handle("slurm", Identity("foreign", Epoch()), "4242", cluster="slurm:far@ctl")
    )
    raw = sqlite3.connect(path)
    raw.execute("UPDATE records SET body = '{\"jobId\": ' WHERE job_id = 'corrupt'")
    raw.commit()
    raw.close()
    store = SqliteStore(path, clock=clock)
    await store.create(
        alien.replace(cluster="slurm:far@ctl", revision=0), (await foreign.history("foreign"))[0]
    )
    cluster = Cluster(backend, store, clock=clock)  # not closed: the store outlives it
    listing = await cluster.list()
    assert [r.job_id for r in listing] == ["healthy", "foreign"]
    assert [u.job_id for u in listing.unreadable] == ["corrupt"]
    sup = cluster.supervisor(poll=1.0)
    report = await sup.step()
    assert [e for e in report.errors if "corrupt" in e] == [
        "corrupt: unreadable record " + listing.unreadable[0].reason.join("()")
    ]
    clock.advance(5)
    await drive(clock, sup, seconds=5)
    assert (await store.get("healthy")).state is State.SUCCEEDED
    assert (await store.get("foreign")).handle == alien.handle  # another cluster's: untouched
