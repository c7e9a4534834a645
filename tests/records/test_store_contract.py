"""The Store contract, run against every implementation (the ``store`` fixture yields each)."""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from pathlib import Path

import pytest
from records_samples import T0, counter_of, full_record, note, simple_record, with_counter

from dispatch import (
    Actor,
    Cause,
    ConflictError,
    Epoch,
    InvalidError,
    JobRecord,
    JobSpec,
    Lease,
    ManualClock,
    NotFoundError,
    OpaqueExtension,
    Outcome,
    State,
    Store,
    Transition,
    UnavailableError,
)
from dispatch.records import ChangeNotifier, Changes, KeyValues, Leasing, MemoryStore, SqliteStore
from dispatch.records.store import MAX_VALUE

# ---- create / get / list ------------------------------------------------------------------------


async def test_create_then_get_round_trips_every_field(store: Store, clock: ManualClock) -> None:
    clock.advance(5)
    original = full_record()
    first = Transition(at=T0, actor=Actor.USER, what="submitted", why="by hand", state=State.PENDING)
    created = await store.create(original, first)
    assert created.revision == 1
    assert created.updated_at == clock.now()
    # Everything else is kept exactly, including the caller's created_at and the lease.
    assert created == original.replace(revision=1, updated_at=clock.now())
    got = await store.get(original.job_id)
    assert got == created
    assert got.to_json() == created.to_json()
    assert got.spec.extensions["acme.example/Thing"].value == {"size": [1, 2, 3], "nested": {"on": True}}
    assert got.outcome.evidence[0].exit_code == 137
    assert got.lease == Lease("supervisor-a", T0 + 300.0)
    assert await store.history(original.job_id) == [first]


async def test_list_is_oldest_first_and_filters_by_state(store: Store, clock: ManualClock) -> None:
    # created_at deliberately out of order: "oldest" means first created in the store.
    for i, state in enumerate([State.RUNNING, State.PENDING, State.SUCCEEDED, State.RUNNING]):
        await store.create(simple_record(f"job-{i}", state=state, at=T0 - i), note("created"))
        clock.advance(1)
    assert [r.job_id for r in await store.list()] == ["job-0", "job-1", "job-2", "job-3"]
    running = await store.list(states=[State.RUNNING])
    assert [r.job_id for r in running] == ["job-0", "job-3"]
    some = await store.list(states={State.SUCCEEDED, State.PENDING})
    assert [r.job_id for r in some] == ["job-1", "job-2"]
    assert await store.list(states=[]) == []
    assert await store.list(states=[State.FAILED]) == []


async def test_an_empty_store_lists_nothing(store: Store) -> None:
    assert await store.list() == []


async def test_duplicate_create_is_a_conflict_and_changes_nothing(store: Store) -> None:
    created = await store.create(simple_record("dup", counter=1), note("first"))
    with pytest.raises(ConflictError, match="dup"):
        await store.create(simple_record("dup", counter=2), note("second"))
    assert await store.get("dup") == created
    assert await store.history("dup") == [note("first")]


# ---- update (compare-and-swap) and history ------------------------------------------------------


async def test_update_bumps_revision_and_appends_history_in_order(store: Store, clock: ManualClock) -> None:
    rec = await store.create(simple_record("job"), note("created"))
    steps = []
    for i in range(1, 4):
        clock.advance(10)
        ts = [note(f"step {i}a", at=clock.now()), note(f"step {i}b", at=clock.now(), cause=Cause.PREEMPTED)]
        steps.extend(ts)
        rec = await store.update(with_counter(rec, i), expected_revision=rec.revision, transitions=ts)
        assert rec.revision == 1 + i
        assert rec.updated_at == clock.now()
        assert counter_of(rec) == i
    assert await store.get("job") == rec
    assert await store.history("job") == [note("created"), *steps]
    # An update with no transitions still counts as a write.
    rec2 = await store.update(rec.replace(hold_requested=True), expected_revision=rec.revision)
    assert rec2.revision == rec.revision + 1 and rec2.hold_requested
    assert len(await store.history("job")) == 7


async def test_update_changes_every_field_but_created_at_and_lease(store: Store, clock: ManualClock) -> None:
    await store.create(simple_record("job"), note("created"))
    leased = await store.acquire_lease("job", "sup", 60)
    target = full_record("job").replace(created_at=1.0, lease=None)
    clock.advance(1)
    stored = await store.update(target, expected_revision=leased.revision)
    assert stored == target.replace(
        created_at=T0, lease=Lease("sup", T0 + 60), revision=leased.revision + 1, updated_at=T0 + 1
    )
    assert await store.get("job") == stored


async def test_stale_revision_is_a_conflict_and_changes_nothing(store: Store) -> None:
    rec = await store.create(simple_record("job"), note("created"))
    winner = await store.update(with_counter(rec, 1), expected_revision=1, transitions=[note("a")])
    for stale in (1, 0, 3, -1):
        with pytest.raises(ConflictError, match="revision 2"):
            await store.update(with_counter(rec, 99), expected_revision=stale, transitions=[note("b")])
    assert await store.get("job") == winner
    assert await store.history("job") == [note("created"), note("a")]


async def test_missing_records_are_not_found(store: Store) -> None:
    with pytest.raises(NotFoundError, match="ghost"):
        await store.get("ghost")
    with pytest.raises(NotFoundError, match="ghost"):
        await store.history("ghost")
    with pytest.raises(NotFoundError, match="ghost"):
        await store.update(simple_record("ghost"), expected_revision=1)
    with pytest.raises(NotFoundError, match="ghost"):
        await store.acquire_lease("ghost", "sup", 10)
    with pytest.raises(NotFoundError, match="ghost"):
        await store.release_lease("ghost", "sup")
    assert await store.list() == []


async def test_history_returned_is_a_copy(store: Store) -> None:
    await store.create(simple_record("job"), note("created"))
    h = await store.history("job")
    h.append(note("forged"))
    h.clear()
    assert await store.history("job") == [note("created")]


async def test_records_returned_have_no_mutable_parts(store: Store) -> None:
    # An unknown extension's value is frozen, so no store needs to copy it on every read.
    rec = await store.create(full_record("job"), note("created"))
    with pytest.raises(TypeError, match="immutable"):
        rec.spec.extensions["acme.example/Thing"].value["size"].append(4)
    again = await store.get("job")
    with pytest.raises(TypeError, match="immutable"):
        again.spec.extensions["acme.example/Thing"].value["nested"]["on"] = False
    with pytest.raises(TypeError, match="immutable"):
        again.spec.env["SEED"] = "2"  # type: ignore[index]
    listed = await store.list()
    assert listed[0].spec.extensions["acme.example/Thing"].value == {
        "size": [1, 2, 3],
        "nested": {"on": True},
    }
    assert listed[0] == rec


async def test_concurrent_tasks_lose_no_update(store: Store) -> None:
    await store.create(simple_record("counter"), note("created"))
    wins: list[int] = []

    async def bump(times: int) -> None:
        for _ in range(times):
            while True:
                cur = await store.get("counter")
                await asyncio.sleep(0)  # let the others read the same revision
                try:
                    new = await store.update(
                        with_counter(cur, counter_of(cur) + 1),
                        expected_revision=cur.revision,
                        transitions=[note("bump")],
                    )
                except ConflictError:
                    continue
                wins.append(new.revision)
                break

    await asyncio.gather(*(bump(5) for _ in range(6)))
    final = await store.get("counter")
    assert counter_of(final) == 30
    assert final.revision == 31
    assert sorted(wins) == list(range(2, 32))  # exactly one winner per revision
    assert len(await store.history("counter")) == 31


async def test_cancelled_updates_leave_the_store_consistent(store: Store) -> None:
    """Cancel a writer while one of its updates is in flight, at many different points of a burst:
    each write is applied whole or not at all, and the store stays usable."""
    rec = await store.create(simple_record("job"), note("created"))
    cancelled = 0
    for stop_after in range(0, 24, 2):
        done: list[int] = []
        reached = asyncio.Event()

        async def writer(start: JobRecord, done: list[int], reached: asyncio.Event, stop_after: int) -> None:
            cur = start
            for _ in range(50):  # each iteration issues the next update as soon as the last returns
                cur = await store.update(
                    with_counter(cur, counter_of(cur) + 1),
                    expected_revision=cur.revision,
                    transitions=[note("bump")],
                )
                done.append(cur.revision)
                if len(done) >= stop_after:
                    reached.set()

        task = asyncio.create_task(writer(rec, done, reached, stop_after))
        if stop_after:
            waiter = asyncio.create_task(reached.wait())
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
        task.cancel()
        # The in-process store never yields inside a call, so its writer may finish before the cancel.
        (result,) = await asyncio.gather(task, return_exceptions=True)
        assert result is None or isinstance(result, asyncio.CancelledError)
        cancelled += result is not None
        # The next call runs after any write that was in flight, so it sees its effect if it landed.
        before = rec.revision
        rec = await store.get("job")
        assert rec.revision in (before + len(done), before + len(done) + 1)
        # Every applied update added one increment and one transition; nothing was half-applied.
        assert counter_of(rec) == rec.revision - 1
        assert len(await store.history("job")) == rec.revision
    after = await store.update(with_counter(rec, 0), expected_revision=rec.revision)
    assert after.revision == rec.revision + 1
    if isinstance(store, SqliteStore):  # its calls run in a thread: the cancels did land mid-burst
        assert cancelled > 0


# ---- leases --------------------------------------------------------------------------------------


async def test_lease_acquire_renew_refuse_takeover_release(store: Store, clock: ManualClock) -> None:
    await store.create(simple_record("job"), note("created"))
    a1 = await store.acquire_lease("job", "sup-a", 30)
    assert a1.lease == Lease("sup-a", T0 + 30) and a1.revision == 2

    clock.advance(10)
    a2 = await store.acquire_lease("job", "sup-a", 30)  # renewal by the holder extends it
    assert a2.lease == Lease("sup-a", T0 + 40) and a2.revision == 3
    assert a2.updated_at == T0 + 10

    clock.advance(29.5)  # still live for sup-a: another holder is refused, naming the holder
    with pytest.raises(ConflictError, match="sup-a"):
        await store.acquire_lease("job", "sup-b", 30)
    with pytest.raises(ConflictError, match="sup-a"):
        await store.release_lease("job", "sup-b")
    assert await store.get("job") == a2

    clock.advance(0.5)  # expired exactly now: sup-b takes over
    b = await store.acquire_lease("job", "sup-b", 30)
    assert b.lease == Lease("sup-b", T0 + 70) and b.revision == 4
    with pytest.raises(ConflictError, match="sup-b"):
        await store.acquire_lease("job", "sup-a", 30)

    released = await store.release_lease("job", "sup-b")
    assert released.lease is None and released.revision == 5
    # Releasing again (or by someone who never held it) is a harmless no-op that writes nothing.
    assert await store.release_lease("job", "sup-b") == released
    assert await store.release_lease("job", "sup-a") == released
    # Lease changes are writes, but not history: history stays what callers appended.
    assert await store.history("job") == [note("created")]


async def test_an_expired_lease_of_another_holder_can_be_released_as_a_no_op(
    store: Store, clock: ManualClock
) -> None:
    await store.create(simple_record("job"), note("created"))
    held = await store.acquire_lease("job", "sup-a", 5)
    clock.advance(6)
    assert await store.release_lease("job", "sup-b") == held
    # The expired holder itself may still clear it.
    cleared = await store.release_lease("job", "sup-a")
    assert cleared.lease is None and cleared.revision == held.revision + 1


async def test_a_lease_change_moves_the_revision_under_a_writer(store: Store) -> None:
    rec = await store.create(simple_record("job"), note("created"))
    await store.acquire_lease("job", "sup", 10)
    with pytest.raises(ConflictError):
        await store.update(with_counter(rec, 1), expected_revision=rec.revision)


@pytest.mark.parametrize("ttl", [0, -1, math.inf, math.nan, "10", True])
async def test_lease_ttl_must_be_positive_and_finite(store: Store, ttl: object) -> None:
    await store.create(simple_record("job"), note("created"))
    with pytest.raises(InvalidError, match="ttl"):
        await store.acquire_lease("job", "sup", ttl)  # type: ignore[arg-type]
    assert (await store.get("job")).lease is None


@pytest.mark.parametrize("holder", ["", "   ", None, 7])
async def test_lease_holder_must_be_a_non_empty_string(store: Store, holder: object) -> None:
    await store.create(simple_record("job"), note("created"))
    with pytest.raises(InvalidError, match="holder"):
        await store.acquire_lease("job", holder, 10)  # type: ignore[arg-type]
    with pytest.raises(InvalidError, match="holder"):
        await store.release_lease("job", holder)  # type: ignore[arg-type]


# ---- purge ---------------------------------------------------------------------------------------


async def test_purge_deletes_only_old_terminal_records_with_their_history(
    store: Store, clock: ManualClock
) -> None:
    states = {
        "old-ok": State.SUCCEEDED,
        "old-failed": State.FAILED,
        "old-cancelled": State.CANCELLED,
        "old-lost": State.LOST,
        "old-running": State.RUNNING,
        "old-pending": State.PENDING,
        "old-held": State.HELD,
        "old-leased": State.SUCCEEDED,
    }
    for job_id, state in states.items():
        await store.create(simple_record(job_id, state=state), note("created"))
    clock.advance(100)
    await store.acquire_lease("old-leased", "sup", 1000)  # a live lease protects it
    await store.create(simple_record("new-ok", state=State.SUCCEEDED), note("created"))
    clock.advance(100)

    assert await store.purge(T0 + 50) == 4
    left = {r.job_id for r in await store.list()}
    assert left == {"old-running", "old-pending", "old-held", "old-leased", "new-ok"}
    for gone in ("old-ok", "old-failed", "old-cancelled", "old-lost"):
        with pytest.raises(NotFoundError):
            await store.get(gone)
        with pytest.raises(NotFoundError):
            await store.history(gone)
    assert await store.purge(T0 + 50) == 0
    # A purged job id can be used again, with a fresh history.
    again = await store.create(simple_record("old-ok"), note("again"))
    assert again.revision == 1
    assert await store.history("old-ok") == [note("again")]
    # The cutoff is strict: a record updated exactly at the cutoff stays.
    assert await store.purge(T0 + 100) == 0
    assert await store.purge(T0 + 100.001) == 1  # new-ok
    # Non-terminal records are never purged, however old.
    assert await store.purge(T0 + 1e9) == 0
    assert {r.job_id for r in await store.list()} >= {"old-running", "old-pending", "old-held"}


async def test_purge_cutoff_must_be_a_number(store: Store) -> None:
    with pytest.raises(InvalidError, match="older_than"):
        await store.purge("yesterday")  # type: ignore[arg-type]
    with pytest.raises(InvalidError, match="older_than"):
        await store.purge(math.nan)


# ---- bad input -----------------------------------------------------------------------------------


async def test_a_record_that_does_not_round_trip_is_refused_before_anything_is_written(store: Store) -> None:
    bad_time = simple_record("job").replace(created_at="yesterday")
    with pytest.raises(InvalidError, match=r"job 'job'") as info:
        await store.create(bad_time, note("created"))
    assert info.value.path == "createdAt"

    # A value that is no JSON never becomes part of a record: the extension itself is refused.
    with pytest.raises(InvalidError, match="expected a JSON value"):
        OpaqueExtension("acme/Thing", {1, 2})

    nan_time = simple_record("job").replace(updated_at=math.nan)
    with pytest.raises(InvalidError, match=r"job 'job'"):
        await store.create(nan_time, note("created"))
    assert await store.list() == []

    rec = await store.create(simple_record("job"), note("created"))
    with pytest.raises(InvalidError, match=r"job 'job'") as info:
        await store.update(rec.replace(epoch="two"), expected_revision=1)
    assert info.value.path == "epoch"
    assert await store.get("job") == rec


async def test_a_transition_that_does_not_round_trip_is_refused(store: Store) -> None:
    with pytest.raises(InvalidError, match=r"job 'job'") as info:
        await store.create(simple_record("job"), Transition(at=math.nan, actor=Actor.USER, what="x"))
    assert info.value.path == "transition.at"
    rec = await store.create(simple_record("job"), note("created"))
    bad = Transition(at=T0, actor="robot", what="x")  # type: ignore[arg-type]
    with pytest.raises(InvalidError, match=r"transitions\[1\]"):
        await store.update(rec, expected_revision=1, transitions=[note("fine"), bad])
    with pytest.raises(InvalidError, match="transitions"):
        await store.update(rec, expected_revision=1, transitions=note("not a list"))  # type: ignore[arg-type]
    with pytest.raises(InvalidError, match="transition"):
        await store.create(simple_record("other"), None)  # type: ignore[arg-type]
    assert await store.get("job") == rec
    assert await store.history("job") == [note("created")]


async def test_other_bad_arguments_are_invalid(store: Store) -> None:
    with pytest.raises(InvalidError, match="job id"):
        await store.get("no spaces allowed")
    with pytest.raises(InvalidError, match=r"states\[0\]"):
        await store.list(states=["running"])  # type: ignore[list-item]
    with pytest.raises(InvalidError) as info:
        await store.list(states=3)  # type: ignore[arg-type]
    assert info.value.path == "states"
    rec = await store.create(simple_record("job"), note("created"))
    with pytest.raises(InvalidError, match="expected_revision"):
        await store.update(rec, expected_revision="1")  # type: ignore[arg-type]
    with pytest.raises(InvalidError, match="JobRecord"):
        await store.create({"jobId": "x"}, note("created"))  # type: ignore[arg-type]


async def test_transitions_keep_their_optional_fields(store: Store) -> None:
    full = Transition(
        at=T0 + 0.25,
        actor=Actor.CLUSTER,
        what="observed",
        why="pod evicted",
        state=State.FAILED,
        cause=Cause.EVICTED,
        epoch=Epoch(2, 1),
    )
    await store.create(simple_record("job"), full)
    assert await store.history("job") == [full]


async def test_outcome_states_are_stored_and_filtered(store: Store) -> None:
    rec = await store.create(simple_record("job"), note("created"))
    done = rec.replace(outcome=Outcome(State.SUCCEEDED))
    await store.update(done, expected_revision=1)
    assert [r.job_id for r in await store.list(states=[State.SUCCEEDED])] == ["job"]
    assert await store.list(states=[State.PENDING]) == []


# ---- change notification -------------------------------------------------------------------------

FEED_TIMEOUT = 20.0  # guards against a hung feed only; every expected id normally arrives in milliseconds


async def seen_until(feed: Changes, wanted: set[str]) -> list[str]:
    """The ids the feed yields, in order, until every id in ``wanted`` has been seen."""
    seen: list[str] = []

    async def read() -> None:
        async for job_id in feed:
            seen.append(job_id)
            if wanted <= set(seen):
                return

    await asyncio.wait_for(read(), FEED_TIMEOUT)
    return seen


async def test_changes_report_every_kind_of_write_after_subscribing(store: Store, clock: ManualClock) -> None:
    assert isinstance(store, ChangeNotifier)
    for job_id in ("updated", "leased", "released", "quiet"):
        await store.create(simple_record(job_id), note("created"))
    await store.create(simple_record("purged", state=State.SUCCEEDED), note("created"))
    held = await store.acquire_lease("released", "sup", 60)
    async with store.changes() as feed:
        rec = await store.get("updated")
        await store.update(with_counter(rec, 1), expected_revision=rec.revision, transitions=[note("a")])
        await store.acquire_lease("leased", "sup", 60)
        await store.release_lease("released", "sup")
        clock.advance(10)
        assert await store.purge(clock.now()) == 1
        await store.create(simple_record("created"), note("created"))
        seen = await seen_until(feed, {"updated", "leased", "released", "purged", "created"})
    # Writes before the subscription, and records nobody wrote, are not reported.
    assert "quiet" not in seen
    assert held.lease is not None


async def test_changes_do_not_report_refused_writes(store: Store) -> None:
    rec = await store.create(simple_record("refused"), note("created"))
    await store.create(simple_record("written"), note("created"))
    await store.acquire_lease("refused", "sup-a", 60)
    async with store.changes() as feed:
        with pytest.raises(ConflictError):
            await store.update(with_counter(rec, 1), expected_revision=rec.revision)
        with pytest.raises(ConflictError):
            await store.acquire_lease("refused", "sup-b", 60)
        with pytest.raises(ConflictError):
            await store.create(simple_record("refused"), note("again"))
        written = await store.get("written")
        await store.update(written, expected_revision=written.revision)
        seen = await seen_until(feed, {"written"})
    assert "refused" not in seen  # a change is reported in commit order: it would have come first


async def test_a_change_feed_ends_when_its_store_closes(store: Store) -> None:
    assert isinstance(store, ChangeNotifier)
    await store.create(simple_record("job"), note("created"))
    async with store.changes() as feed:
        waiting = asyncio.create_task(seen_until(feed, {"never"}))
        await asyncio.sleep(0.05)
        await store.close()
        with pytest.raises(UnavailableError, match="closed"):
            await waiting


async def test_a_change_feed_of_a_closed_store_ends_at_once(store: Store) -> None:
    assert isinstance(store, ChangeNotifier)
    await store.list()
    await store.close()
    with pytest.raises(UnavailableError, match="closed"):
        async with store.changes() as feed:
            await seen_until(feed, {"never"})


async def test_a_change_feed_is_used_inside_async_with(store: Store) -> None:
    assert isinstance(store, ChangeNotifier)
    feed = store.changes()
    with pytest.raises(InvalidError, match="async with"):
        await anext(aiter(feed))


# ---- lifecycle -----------------------------------------------------------------------------------


async def test_a_closed_store_refuses_calls_and_close_is_idempotent(store: Store) -> None:
    await store.create(simple_record("job"), note("created"))
    await store.close()
    await store.close()
    with pytest.raises(UnavailableError, match="closed"):
        await store.get("job")
    with pytest.raises(UnavailableError, match="closed"):
        await store.create(simple_record("other"), note("created"))


def test_every_store_satisfies_the_protocol_and_the_change_hook() -> None:
    from dispatch.records import MemoryStore, PostgresStore, SqliteStore

    assert isinstance(MemoryStore(), Store)
    assert isinstance(MemoryStore(), ChangeNotifier)
    assert isinstance(MemoryStore(), KeyValues)
    for cls in (SqliteStore, PostgresStore):
        assert issubclass(cls, Store)
        assert issubclass(cls, ChangeNotifier)
        assert issubclass(cls, KeyValues)


# ---- the key-value table beside the records (KeyValues) -----------------------------------------


async def test_key_values_round_trip_replace_and_delete(store: Store) -> None:
    assert isinstance(store, KeyValues)
    assert await store.get_value("probe/x") is None
    await store.put_value("probe/x", '{"a": 1}')
    await store.put_value("probe/x", '{"a": 2}')
    assert await store.get_value("probe/x") == '{"a": 2}'
    await store.put_value("other", "é ☃ " + "y" * 1000)
    assert await store.get_value("other") == "é ☃ " + "y" * 1000
    await store.put_value("probe/x", None)
    assert await store.get_value("probe/x") is None
    await store.put_value("never-kept", None)  # removing what is not there is no error
    assert await store.list() == []  # values are not records


async def test_key_values_keep_the_largest_value_allowed(store: Store) -> None:
    assert isinstance(store, KeyValues)
    await store.put_value("big", "x" * MAX_VALUE)
    assert await store.get_value("big") == "x" * MAX_VALUE


@pytest.mark.parametrize(
    ("key", "value", "path"),
    [
        ("", "v", "key"),
        ("k" * 513, "v", "key"),
        (3, "v", "key"),
        ("a\x00b", "v", "key"),
        ("k", 3, "value"),
        ("k", "x" * (MAX_VALUE + 1), "value"),
        ("k", "a\x00b", "value"),
    ],
)
async def test_key_values_refuse_bad_keys_and_values(
    store: Store, key: object, value: object, path: str
) -> None:
    assert isinstance(store, KeyValues)
    with pytest.raises(InvalidError) as info:
        await store.put_value(key, value)  # type: ignore[arg-type]
    assert info.value.path == path
    assert await store.get_value("k") is None  # nothing was kept


async def test_key_values_are_shared_by_every_handle_on_the_store(
    store: Store, request: pytest.FixtureRequest, clock: ManualClock, tmp_path: Path
) -> None:
    if isinstance(store, MemoryStore):
        pytest.skip("a MemoryStore is one process's own")
    assert isinstance(store, KeyValues)
    await store.put_value("shared", "1")
    if isinstance(store, SqliteStore):
        other: Store = SqliteStore(tmp_path / "state" / "jobs.db", clock=clock)  # the fixture's file
    else:
        from dispatch.records import PostgresStore

        other = PostgresStore(request.getfixturevalue("pg_dsn"), clock=clock)  # the test's database
    try:
        assert isinstance(other, KeyValues)
        assert await other.get_value("shared") == "1"
        await other.put_value("shared", "2")
    finally:
        await other.close()
    assert await store.get_value("shared") == "2"


async def test_a_version_1_sqlite_store_is_migrated_and_keeps_its_records(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "v1.db"
    first = SqliteStore(path)
    await first.create(simple_record("a"), note("created"))
    await first.close()
    with sqlite3.connect(path) as raw:  # make it a version-1 file: no kv table, no fleet members
        raw.execute("DROP TABLE kv")
        raw.execute("DROP TABLE members")
        raw.execute("DROP INDEX records_by_holder")
        raw.execute("PRAGMA user_version = 1")
    raw.close()
    again = SqliteStore(path)
    assert [r.job_id for r in await again.list()] == ["a"]
    await again.put_value("k", "v")
    assert await again.get_value("k") == "v"
    await again.close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone() == (3,)
    raw.close()


async def test_every_spec_that_decodes_is_stored_whatever_its_depth(store: Store) -> None:
    """Decoding and storing agree on depth: a spec nested as deep as the decoder allows is stored and
    read back (it sits a few levels down inside its record); one level more is refused by decoding."""
    from dispatch.model._decode import MAX_DEPTH

    def text(lists: int) -> str:  # root, extensions, the extension's value, then `lists` lists
        return '{"command": ["x"], "extensions": {"acme/Thing": {"a": ' + "[" * lists + "]" * lists + "}}}"

    deepest = JobSpec.loads(text(MAX_DEPTH - 3))
    rec = simple_record("deep")
    rec = rec.replace(spec=deepest)
    await store.create(rec, note("created"))
    assert (await store.get("deep")).spec == deepest
    assert [r.job_id for r in await store.list()] == ["deep"]
    with pytest.raises(InvalidError, match="nested too deeply"):
        JobSpec.loads(text(MAX_DEPTH - 2))


# ---- Leasing: what a fleet of supervisors asks of the store -----------------------------------------


async def test_fleet_members_heartbeat_and_expire(store: Store, clock: ManualClock) -> None:
    assert isinstance(store, Leasing)
    assert await store.heartbeat("memory/c1", "sup-b", 10, join=True) == ["sup-b"]
    assert await store.heartbeat("memory/c1", "sup-a", 10, join=True) == ["sup-a", "sup-b"]
    assert await store.heartbeat("memory/c2", "sup-c", 10, join=True) == ["sup-c"]  # another cluster's fleet
    clock.advance(6)
    assert await store.heartbeat("memory/c1", "sup-a", 10) == ["sup-a", "sup-b"]
    clock.advance(4)  # sup-b's membership ended exactly now; sup-a renewed its own
    assert await store.heartbeat("memory/c1", "sup-a", 10) == ["sup-a"]
    with pytest.raises(InvalidError, match="group"):
        await store.heartbeat("", "sup-a", 10)
    with pytest.raises(InvalidError, match="ttl"):
        await store.heartbeat("memory/c1", "sup-a", -1)


async def test_a_heartbeat_never_revives_an_ended_membership(store: Store, clock: ManualClock) -> None:
    assert isinstance(store, Leasing)
    assert await store.heartbeat("memory/c1", "sup-a", 10) == []  # never joined: not made a member
    await store.heartbeat("memory/c1", "sup-a", 10, join=True)
    clock.advance(11)
    # Lapsed, but nobody ended it yet: renewed (nothing of it was taken meanwhile).
    assert await store.heartbeat("memory/c1", "sup-a", 10) == ["sup-a"]
    clock.advance(11)
    assert await store.heartbeat("memory/c1", "sup-b", 10, join=True) == ["sup-b"]  # ends sup-a's
    assert await store.heartbeat("memory/c1", "sup-a", 10) == ["sup-b"]  # left out: it must join again
    assert await store.heartbeat("memory/c1", "sup-a", 10, join=True) == ["sup-a", "sup-b"]


async def test_a_members_leases_last_as_long_as_its_membership(store: Store, clock: ManualClock) -> None:
    assert isinstance(store, Leasing)
    for jid in ("a", "b", "c"):
        await store.create(simple_record(jid), note("created"))
    await store.heartbeat("memory/c1", "sup-a", 10, join=True)
    await store.acquire_lease("a", "sup-a", 1000)
    await store.acquire_lease("b", "sup-a", 1000)
    await store.acquire_lease("c", "sup-z", 5)  # not a member: its lease lasts its own time
    await store.heartbeat("memory/c1", "sup-b", 10, join=True)
    for _ in range(5):  # sup-a keeps its membership: its leases hold, and are not rewritten
        clock.advance(8)
        await store.heartbeat("memory/c1", "sup-a", 10)
        await store.heartbeat("memory/c1", "sup-b", 10)
        with pytest.raises(ConflictError, match="sup-a"):
            await store.acquire_lease("a", "sup-b", 1000)
    before = await store.get("a")
    assert before.lease is not None and before.lease.expires_at == T0 + 1000
    clock.advance(10)  # sup-a's membership lapsed; the next heartbeat of any member ends it
    assert await store.heartbeat("memory/c1", "sup-b", 10) == ["sup-b"]
    now = T0 + 50
    for jid in ("a", "b"):
        ended = await store.get(jid)
        assert ended.lease is not None and ended.lease.holder == "sup-a" and ended.lease.expires_at == now
        assert ended.revision == before.revision + 1
    took = await store.acquire_lease("a", "sup-b", 1000)  # claimable at once
    assert took.lease is not None and took.lease.holder == "sup-b"
    page = await store.leasable("sup-b", states={State.PENDING}, limit=10)
    assert [r.job_id for r in page] == ["a", "b", "c"]


async def test_joining_again_ends_what_a_holder_leased_since_its_membership_ended(
    store: Store, clock: ManualClock
) -> None:
    assert isinstance(store, Leasing)
    await store.create(simple_record("a"), note("created"))
    await store.heartbeat("memory/c1", "sup-a", 10, join=True)
    clock.advance(11)
    await store.heartbeat("memory/c1", "sup-b", 10, join=True)  # sup-a's membership ends
    # A lease taken by a request sent while sup-a was still a member, which arrived after its end.
    await store.acquire_lease("a", "sup-a", 1000)
    assert await store.heartbeat("memory/c1", "sup-a", 10) == ["sup-b"]
    assert (await store.get("a")).lease.live(T0 + 11)  # type: ignore[union-attr]
    await store.heartbeat("memory/c1", "sup-a", 10, join=True)
    ended = (await store.get("a")).lease
    assert ended is not None and ended.expires_at == T0 + 11 and not ended.live(T0 + 11)


async def test_a_members_lease_is_taken_and_renewed_only_while_it_is_a_member(
    store: Store, clock: ManualClock
) -> None:
    """A take or renewal sent while a member and arriving after its membership ended is refused: a
    lease taken for as long as the membership must never outlive it (nothing would end it)."""
    assert isinstance(store, Leasing)
    for jid in ("a", "b"):
        await store.create(simple_record(jid), note("created"))
    with pytest.raises(ConflictError, match="not a member"):
        await store.member_lease("memory/c1", "a", "sup-a", 1000)  # never joined
    await store.heartbeat("memory/c1", "sup-a", 10, join=True)
    with pytest.raises(ConflictError, match="not a member"):
        await store.member_lease("memory/c2", "a", "sup-a", 1000)  # another group's membership
    taken = await store.member_lease("memory/c1", "a", "sup-a", 1000)
    assert taken.lease == Lease("sup-a", T0 + 1000)
    again = await store.member_lease("memory/c1", "a", "sup-a", 1000)  # its own: renewed
    assert again.lease == Lease("sup-a", T0 + 1000) and again.revision == taken.revision + 1
    renewed = await store.renew_leases("sup-a", 1000, ["a"], group="memory/c1")
    assert [r.job_id for r in renewed] == ["a"]
    await store.heartbeat("memory/c1", "sup-b", 10, join=True)
    with pytest.raises(ConflictError, match="sup-b"):
        await store.member_lease("memory/c1", "a", "sup-b", 1000)  # sup-a's, live
    clock.advance(11)
    await store.heartbeat("memory/c1", "sup-b", 10)  # ends sup-a's membership, and its lease on a
    with pytest.raises(ConflictError, match="not a member"):
        await store.member_lease("memory/c1", "b", "sup-a", 1000)
    assert await store.renew_leases("sup-a", 1000, ["a"], group="memory/c1") == []
    ended = await store.get("a")
    assert ended.lease == Lease("sup-a", T0 + 11) and not ended.lease.live(clock.now())
    took = await store.member_lease("memory/c1", "a", "sup-b", 1000)
    assert took.lease == Lease("sup-b", T0 + 1011)


async def test_a_member_that_leaves_is_no_longer_listed(store: Store, clock: ManualClock) -> None:
    assert isinstance(store, Leasing)
    await store.heartbeat("memory/c1", "sup-a", 10, join=True)
    await store.heartbeat("memory/c2", "sup-a", 10, join=True)
    assert await store.heartbeat("memory/c1", "sup-b", 10, join=True) == ["sup-a", "sup-b"]
    await store.leave("memory/c1", "sup-a")  # at once, not when its membership would have ended
    await store.leave("memory/c1", "sup-z")  # never a member: nothing happens
    assert await store.heartbeat("memory/c1", "sup-b", 10) == ["sup-b"]
    assert await store.heartbeat("memory/c2", "sup-c", 10, join=True) == [
        "sup-a",
        "sup-c",
    ]  # its other fleet's
    with pytest.raises(InvalidError, match="holder"):
        await store.leave("memory/c1", "")


async def test_leaving_gives_back_every_lease_in_one_call(store: Store, clock: ManualClock) -> None:
    assert isinstance(store, Leasing)
    for jid in ("a", "b", "c"):
        await store.create(simple_record(jid), note("created"))
    await store.heartbeat("memory/c1", "sup-a", 10, join=True)
    await store.heartbeat("memory/c2", "sup-a", 10, join=True)
    for jid in ("a", "b"):
        await store.acquire_lease(jid, "sup-a", 1000)
    await store.acquire_lease("c", "sup-b", 1000)
    revisions = {jid: (await store.get(jid)).revision for jid in ("a", "b", "c")}
    await store.leave("memory/c1", "sup-a")  # still a member of c2: its leases stay
    assert [(await store.get(j)).lease is not None for j in ("a", "b")] == [True, True]
    await store.leave("memory/c2", "sup-a")
    for jid in ("a", "b"):
        rec = await store.get(jid)
        assert rec.lease is None and rec.revision == revisions[jid] + 1
    kept = await store.get("c")
    assert kept.lease is not None and kept.revision == revisions["c"]  # another holder's: untouched


async def test_leasable_is_what_a_holder_leases_then_a_page_of_claimable_records(
    store: Store, clock: ManualClock
) -> None:
    assert isinstance(store, Leasing)
    for jid in ("a", "b", "c", "d", "e"):
        await store.create(simple_record(jid), note("created"))
    await store.create(simple_record("f", state=State.SUCCEEDED), note("created"))
    await store.acquire_lease("d", "sup-a", 10)
    await store.acquire_lease("b", "sup-b", 10)  # live: not claimable
    await store.acquire_lease("c", "sup-b", 5)
    clock.advance(5)  # c's lease lapsed: claimable
    pending = {State.PENDING}

    def ids(listing: list[JobRecord]) -> list[str]:
        return [r.job_id for r in listing]

    assert ids(await store.leasable("sup-a", states=pending, limit=2)) == ["d", "a", "c"]
    assert ids(await store.leasable("sup-a", states=pending, limit=2, after="c")) == ["d", "e"]
    assert ids(await store.leasable("sup-a", states={State.SUCCEEDED}, limit=9)) == ["d", "f"]
    # A lapsed lease that still names sup-b is sup-b's to renew: listed among its own.
    assert ids(await store.leasable("sup-b", states=pending, limit=9)) == ["b", "c", "a", "e"]
    with pytest.raises(InvalidError, match="limit"):
        await store.leasable("sup-a", states=pending, limit=0)


async def test_held_is_the_revision_of_each_record_a_holder_leases(store: Store, clock: ManualClock) -> None:
    assert isinstance(store, Leasing)
    for jid in ("a", "b", "c", "d"):
        await store.create(simple_record(jid), note("created"))
    await store.acquire_lease("a", "sup-a", 10)
    await store.acquire_lease("b", "sup-a", 5)
    await store.acquire_lease("c", "sup-b", 10)
    clock.advance(5)  # b's lease lapsed, still naming sup-a: its to renew
    rec = await store.get("a")
    await store.update(rec.replace(outcome=Outcome(State.RUNNING)), expected_revision=rec.revision)
    assert await store.held("sup-a") == {"a": 3, "b": 2}
    assert await store.held("nobody") == {}
    # Only the records asked for among the holder's own (another's, or none's, never), then the page.
    got = await store.leasable("sup-a", states={State.PENDING}, limit=9, held=["b", "c", "missing"])
    assert [r.job_id for r in got] == ["b", "d"]
    assert [r.job_id for r in await store.leasable("sup-a", states={State.PENDING}, limit=9, held=[])] == [
        "d"
    ]


async def test_held_is_in_job_id_order(store: Store) -> None:
    """A scan merges what it leases with a page in job id order: held comes in that order already."""
    assert isinstance(store, Leasing)
    for jid in ("z", "m", "a"):
        await store.create(simple_record(jid), note("created"))
        await store.acquire_lease(jid, "sup-a", 10)
    assert list(await store.held("sup-a")) == ["a", "m", "z"]


async def test_held_comes_in_pages_by_job_id(store: Store, clock: ManualClock) -> None:
    """A supervisor holding 100,000 leases reads their revisions a page at a time: each page starts
    after the last job id of the one before, and together they are every lease the holder holds."""
    assert isinstance(store, Leasing)
    for jid in ("e", "a", "d", "b", "c", "f"):
        await store.create(simple_record(jid), note("created"))
        await store.acquire_lease(jid, "sup-b" if jid == "d" else "sup-a", 10)
    clock.advance(11)  # lapsed, still naming sup-a: listed, as without a page
    assert await store.held("sup-a", limit=2) == {"a": 2, "b": 2}
    await store.create(simple_record("bb"), note("created"))  # between two pages
    await store.acquire_lease("bb", "sup-a", 10)
    assert await store.held("sup-a", after="b", limit=2) == {"bb": 2, "c": 2}
    await store.release_lease("bb", "sup-a")
    assert await store.held("sup-a", after="b", limit=2) == {"c": 2, "e": 2}
    assert await store.held("sup-a", after="e", limit=2) == {"f": 2}
    assert await store.held("sup-a", after="f", limit=2) == {}
    assert await store.held("sup-a", after="bb") == {"c": 2, "e": 2, "f": 2}
    assert await store.held("sup-a") == {"a": 2, "b": 2, "c": 2, "e": 2, "f": 2}
    with pytest.raises(InvalidError, match="limit"):
        await store.held("sup-a", limit=0)
    with pytest.raises(InvalidError, match="after"):
        await store.held("sup-a", after=None)  # type: ignore[arg-type]


async def test_records_are_those_of_the_job_ids_asked_for(store: Store) -> None:
    assert isinstance(store, Leasing)
    for jid in ("a", "b", "c"):
        await store.create(simple_record(jid), note("created"))
    await store.create(simple_record("d", state=State.SUCCEEDED), note("created"))
    assert [r.job_id for r in await store.records(["d", "a", "missing", "a"])] == ["a", "d"]
    assert [r.job_id for r in await store.records(["a", "b", "d"], states={State.SUCCEEDED})] == ["d"]
    assert await store.records([]) == []
    assert await store.records(["a"]) == [await store.get("a")]


async def test_counts_are_the_records_in_each_state(store: Store, clock: ManualClock) -> None:
    assert isinstance(store, Leasing)
    assert await store.counts() == {}
    for jid in ("a", "b", "c"):
        await store.create(simple_record(jid), note("created"))
    await store.create(simple_record("d", state=State.SUCCEEDED), note("created"))
    rec = await store.get("a")
    await store.update(rec.replace(outcome=Outcome(State.RUNNING)), expected_revision=rec.revision)
    await store.acquire_lease("b", "sup-a", 10)  # a lease changes no state
    assert await store.counts() == {State.PENDING: 2, State.RUNNING: 1, State.SUCCEEDED: 1}
    assert await store.counts() == Counter(r.state for r in await store.list())


async def test_renew_leases_renews_only_the_holders_own_in_one_call(store: Store, clock: ManualClock) -> None:
    assert isinstance(store, Leasing)
    for jid in ("a", "b", "c"):
        await store.create(simple_record(jid), note("created"))
    await store.acquire_lease("a", "sup-a", 10)
    await store.acquire_lease("b", "sup-a", 10)
    await store.acquire_lease("c", "sup-b", 10)
    clock.advance(12)  # a and b lapsed, nobody took them: still sup-a's to renew
    await store.acquire_lease("b", "sup-b", 10)  # ... but sup-b took b
    renewed = await store.renew_leases("sup-a", 10, ["a", "b", "c", "missing"])
    assert [(r.job_id, r.lease) for r in renewed] == [("a", Lease("sup-a", T0 + 22))]
    assert await store.get("a") == renewed[0] and renewed[0].revision == 3
    assert (await store.get("b")).lease == Lease("sup-b", T0 + 22)
    assert (await store.get("c")).lease == Lease("sup-b", T0 + 10)
