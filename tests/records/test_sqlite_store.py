"""What only the SQLite store has: a file, several handles on it, bad files, locks, its location."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from records_samples import T0, counter_of, full_record, note, simple_record, with_counter

from dispatch import ConflictError, InvalidError, ManualClock, NotFoundError, UnavailableError
from dispatch.records import SqliteStore, default_store_path
from dispatch.records.sqlite import SCHEMA_VERSION


async def test_records_outlive_the_handle_and_the_directory_is_created(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "er" / "jobs.db"
    clock = ManualClock()
    store = SqliteStore(path, clock=clock)
    created = await store.create(full_record("job"), note("created"))
    await store.update(created.replace(hold_requested=False), expected_revision=1, transitions=[note("x")])
    await store.close()
    assert path.is_file()

    again = SqliteStore(str(path), clock=clock)
    rec = await again.get("job")
    assert rec.revision == 2 and rec.hold_requested is False
    assert rec.spec == full_record("job").spec
    assert await again.history("job") == [note("created"), note("x")]
    await again.close()


async def test_the_file_is_a_marked_wal_database_with_a_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path)
    await store.list()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
        assert raw.execute("PRAGMA application_id").fetchone()[0] == 0x44535043
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    raw.close()
    await store.close()


async def test_history_is_append_only_in_the_file_itself(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path)
    await store.create(simple_record("job"), note("created"))
    raw = sqlite3.connect(path)
    with pytest.raises(sqlite3.DatabaseError, match="append-only"):
        raw.execute("UPDATE history SET body = '{}'")
    with pytest.raises(sqlite3.DatabaseError, match="only with its record"):
        raw.execute("DELETE FROM history")
    raw.close()
    assert await store.history("job") == [note("created")]
    await store.close()


async def test_two_handles_on_one_file_compare_and_swap(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    clock = ManualClock()
    a = SqliteStore(path, clock=clock)
    b = SqliteStore(path, clock=clock)
    rec = await a.create(simple_record("job"), note("created"))
    seen_by_b = await b.get("job")
    assert seen_by_b == rec
    # Both try to write revision 2 from revision 1: exactly one wins.
    results = await asyncio.gather(
        a.update(with_counter(rec, 10), expected_revision=1, transitions=[note("a")]),
        b.update(with_counter(seen_by_b, 20), expected_revision=1, transitions=[note("b")]),
        return_exceptions=True,
    )
    wins = [r for r in results if not isinstance(r, BaseException)]
    losses = [r for r in results if isinstance(r, BaseException)]
    assert len(wins) == 1 and len(losses) == 1 and isinstance(losses[0], ConflictError)
    assert await a.get("job") == await b.get("job") == wins[0]
    assert len(await b.history("job")) == 2

    # Leases are visible across handles too.
    await a.acquire_lease("job", "sup-a", 60)
    with pytest.raises(ConflictError, match="sup-a"):
        await b.acquire_lease("job", "sup-b", 60)
    clock.advance(61)
    assert (await b.acquire_lease("job", "sup-b", 60)).lease is not None
    await a.close()
    await b.close()


async def test_many_tasks_on_two_handles_lose_no_update(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    handles = [SqliteStore(path), SqliteStore(path)]
    await handles[0].create(simple_record("counter"), note("created"))

    async def bump(store: SqliteStore, times: int) -> None:
        for _ in range(times):
            while True:
                cur = await store.get("counter")
                try:
                    await store.update(with_counter(cur, counter_of(cur) + 1), expected_revision=cur.revision)
                    break
                except ConflictError:
                    continue

    await asyncio.gather(*(bump(handles[i % 2], 10) for i in range(4)))
    final = await handles[1].get("counter")
    assert counter_of(final) == 40 and final.revision == 41
    for h in handles:
        await h.close()


# ---- bad files and paths --------------------------------------------------------------------------


def test_a_directory_is_refused_naming_the_path(tmp_path: Path) -> None:
    with pytest.raises(InvalidError, match="is a directory") as info:
        SqliteStore(tmp_path)
    assert str(tmp_path) in str(info.value)


def test_a_file_in_the_way_of_the_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InvalidError, match="afile"):
        SqliteStore(tmp_path / "afile" / "jobs.db")


@pytest.mark.parametrize("bad", ["", ":memory:", "file:jobs.db?mode=memory", b"jobs.db", 7, None])
def test_non_file_paths_are_refused(bad: object) -> None:
    with pytest.raises(InvalidError, match="path"):
        SqliteStore(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [0, -1.0, float("nan"), "30"])
def test_busy_timeout_must_be_positive(tmp_path: Path, timeout: object) -> None:
    with pytest.raises(InvalidError, match="busy_timeout"):
        SqliteStore(tmp_path / "jobs.db", busy_timeout=timeout)  # type: ignore[arg-type]


def test_a_file_that_is_not_sqlite_is_refused_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("these are my notes, not a database\n" * 20)
    with pytest.raises(InvalidError, match="not a SQLite database") as info:
        SqliteStore(path)
    assert str(path) in str(info.value)
    assert path.read_text().startswith("these are my notes")


async def test_a_foreign_sqlite_database_is_refused_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    raw = sqlite3.connect(path)
    raw.execute("CREATE TABLE photos (name TEXT)")
    raw.execute("INSERT INTO photos VALUES ('cat.jpg')")
    raw.commit()
    raw.close()
    store = SqliteStore(path)
    with pytest.raises(InvalidError, match="not a dispatch store") as info:
        await store.list()
    assert str(path) in str(info.value)
    await store.close()
    raw = sqlite3.connect(path)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "delete"  # not switched to WAL
    assert raw.execute("SELECT name FROM photos").fetchall() == [("cat.jpg",)]
    raw.close()


async def test_a_store_from_a_newer_dispatch_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path)
    await store.create(simple_record("job"), note("created"))
    await store.close()
    raw = sqlite3.connect(path)
    raw.execute("PRAGMA user_version = 99")
    raw.close()
    again = SqliteStore(path)
    with pytest.raises(InvalidError, match="newer dispatch") as info:
        await again.get("job")
    assert str(path) in str(info.value)
    await again.close()


async def test_a_corrupt_file_is_unavailable_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path)
    for i in range(50):
        await store.create(full_record(f"job-{i}"), note("created"))
    await store.close()
    data = bytearray(path.read_bytes())
    assert len(data) > 8192
    data[4096:] = b"\xa5" * (len(data) - 4096)  # every page after the first is garbage
    path.write_bytes(bytes(data))
    again = SqliteStore(path)
    with pytest.raises((UnavailableError, InvalidError)) as info:
        await again.list()
    assert str(path) in str(info.value)
    await again.close()


async def test_a_stored_row_that_does_not_decode_names_the_job(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path)
    await store.create(simple_record("good"), note("created"))
    await store.create(simple_record("bad"), note("created"))
    await store.create(simple_record("fine"), note("created"))
    raw = sqlite3.connect(path)
    body = raw.execute("SELECT body FROM records WHERE job_id = 'bad'").fetchone()[0]
    raw.execute(
        "UPDATE records SET body = ? WHERE job_id = 'bad'", (body.replace('"pending"', '"exploded"'),)
    )
    raw.execute("UPDATE records SET body = '{\"jobId\": \"good\"}' WHERE job_id = 'good'")
    raw.commit()
    raw.close()
    with pytest.raises(InvalidError, match="job 'bad'") as info:
        await store.get("bad")
    assert "exploded" in str(info.value) and str(path) in str(info.value)
    with pytest.raises(InvalidError, match=r"job 'good'.*spec"):
        await store.get("good")
    # A listing reads the others and names each unreadable record on its own (one never stops the rest).
    listing = await store.list()
    assert [r.job_id for r in listing] == ["fine"]
    assert [u.job_id for u in listing.unreadable] == ["good", "bad"]
    assert "exploded" in listing.unreadable[1].reason and str(path) in listing.unreadable[1].reason
    with pytest.raises(InvalidError, match="job 'bad'"):
        await store.update(simple_record("bad"), expected_revision=1)
    await store.close()


async def test_a_lock_held_too_long_is_unavailable_within_the_bound(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path, busy_timeout=0.2)
    rec = await store.create(simple_record("job"), note("created"))
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")  # another process holding the write lock
    try:
        with pytest.raises(UnavailableError, match="locked") as info:
            await store.update(with_counter(rec, 1), expected_revision=1)
        assert str(path) in str(info.value)
        assert await store.get("job") == rec  # readers are not blocked by a writer under WAL
    finally:
        raw.execute("ROLLBACK")
        raw.close()
    assert (await store.update(with_counter(rec, 1), expected_revision=1)).revision == 2
    await store.close()


async def test_not_found_is_not_confused_with_a_missing_file(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    with pytest.raises(NotFoundError):
        await store.get("nobody")
    await store.close()


def test_repr_names_the_path_only(tmp_path: Path) -> None:
    store = SqliteStore(tmp_path / "jobs.db")
    assert repr(store) == f"SqliteStore({str(tmp_path / 'jobs.db')!r})"
    assert store.path == tmp_path / "jobs.db"


# ---- where the default store lives ---------------------------------------------------------------


def test_default_store_path_follows_the_environment() -> None:
    assert default_store_path({"DISPATCH_STATE_DIR": "/srv/d", "XDG_STATE_HOME": "/x"}) == Path(
        "/srv/d/jobs.db"
    )
    assert default_store_path({"XDG_STATE_HOME": "/x/state", "HOME": "/home/u"}) == Path(
        "/x/state/dispatch/jobs.db"
    )
    # A relative XDG_STATE_HOME is ignored, as the XDG base-directory spec says.
    assert default_store_path({"XDG_STATE_HOME": "rel", "HOME": "/home/u"}) == Path(
        "/home/u/.local/state/dispatch/jobs.db"
    )
    assert default_store_path({"HOME": "/home/u"}) == Path("/home/u/.local/state/dispatch/jobs.db")
    assert default_store_path({"DISPATCH_STATE_DIR": "", "HOME": "/home/u"}) == Path(
        "/home/u/.local/state/dispatch/jobs.db"
    )


def test_default_store_path_reads_os_environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DISPATCH_STATE_DIR", str(tmp_path))
    assert default_store_path() == tmp_path / "jobs.db"


def test_importing_dispatch_does_not_import_sqlite3() -> None:
    code = (
        "import sys, dispatch, dispatch.records; "
        "assert 'sqlite3' not in sys.modules, 'sqlite3 imported'; "
        "from dispatch.records import MemoryStore, default_store_path; "
        "assert 'sqlite3' not in sys.modules, 'sqlite3 imported by MemoryStore'; "
        "from dispatch.records import SqliteStore; assert 'sqlite3' in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_unknown_names_are_attribute_errors() -> None:
    import dispatch.records

    with pytest.raises(AttributeError, match="NoSuchStore"):
        dispatch.records.NoSuchStore  # noqa: B018


async def test_timestamps_come_from_the_store_clock(tmp_path: Path) -> None:
    clock = ManualClock(start=T0 + 1000)
    store = SqliteStore(tmp_path / "jobs.db", clock=clock)
    rec = await store.create(simple_record("job"), note("created"))
    assert rec.updated_at == T0 + 1000 and rec.created_at == T0
    await store.close()


def _hold_write_lock(path: Path) -> sqlite3.Connection:
    """Another process's first open of the same new store, caught holding its write lock: switching
    to WAL then fails at once with SQLITE_BUSY (SQLite's busy handler is not called there)."""
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("BEGIN IMMEDIATE")
    return raw


async def test_a_first_open_waits_for_another_openers_lock(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    raw = _hold_write_lock(path)
    loop = asyncio.get_running_loop()
    loop.call_later(0.3, raw.execute, "COMMIT")
    store = SqliteStore(path, busy_timeout=10)
    try:
        started = loop.time()
        assert await store.list() == []  # waited for the lock instead of failing at once
        assert loop.time() - started >= 0.25
        await store.create(simple_record("job"), note("created"))
    finally:
        await store.close()
        raw.close()


async def test_a_first_open_locked_too_long_says_how_long_it_waited(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    raw = _hold_write_lock(path)
    store = SqliteStore(path, busy_timeout=0.4)
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(UnavailableError, match="locked") as info:
            await store.list()
        waited = loop.time() - started
        assert 0.4 <= waited < 5
        claimed = float(str(info.value).split("gave up after ")[1].split("s")[0])
        assert 0.39 <= claimed <= waited + 0.01  # the truth (to 2 decimals), not the bound
    finally:
        await store.close()
        raw.execute("ROLLBACK")
        raw.close()
