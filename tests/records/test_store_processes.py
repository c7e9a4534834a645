"""Several processes on one shared store (a SQLite file, a PostgreSQL database): compare-and-swap,
leases, a dead supervisor's leases taken over, writers killed mid-burst, migrations racing.

The other processes run ``records_child.py``; it prints a line for every write after the call returned
(flushed), so the parent knows exactly which writes were acknowledged. Each test runs on both shared
stores: ``where`` is the SQLite file or the PostgreSQL URL, and ``opener`` opens a store on it.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path

import pytest
from records_samples import counter_of, note, simple_record, with_counter

from dispatch import Clock, ConflictError, ManualClock, Store
from dispatch.records import SqliteStore

CHILD = Path(__file__).with_name("records_child.py")
LINE_TIMEOUT = 60.0  # generous: only guards against a hung child, never part of an assertion

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL")

Opener = Callable[..., Store]


@pytest.fixture(params=["sqlite", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where the shared store lives: a new SQLite file, or a new PostgreSQL database's URL."""
    if request.param == "sqlite":
        return str(tmp_path / "new" / "jobs.db")
    dsn: str = request.getfixturevalue("pg_dsn")
    return dsn


def open_at(where: str, clock: Clock | None = None) -> Store:
    if where.startswith("postgresql://"):
        from dispatch.records import PostgresStore

        return PostgresStore(where, clock=clock)
    return SqliteStore(where, clock=clock)


class Child:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    async def line(self) -> str:
        assert self.proc.stdout is not None
        raw = await asyncio.wait_for(self.proc.stdout.readline(), LINE_TIMEOUT)
        if not raw:
            err = b""
            if self.proc.stderr is not None:
                err = await self.proc.stderr.read()
            raise AssertionError(f"child ended early: {err.decode(errors='replace')}")
        return raw.decode().rstrip("\n")

    async def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        await self.proc.stdin.drain()

    async def lines_until_done(self) -> list[str]:
        out = []
        while (line := await self.line()) != "done":
            out.append(line)
        assert await asyncio.wait_for(self.proc.wait(), LINE_TIMEOUT) == 0
        return out


@asynccontextmanager
async def child(mode: str, where: str, *args: str) -> AsyncIterator[Child]:
    proc = await spawn(mode, where, *args)
    c = Child(proc)
    try:
        assert await c.line() == "ready"
        yield c
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def spawn(mode: str, where: str, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        mode,
        where,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


async def test_two_processes_incrementing_lose_no_update(where: str) -> None:
    path = where
    store = open_at(where)
    await store.create(simple_record("counter"), note("created"))
    n = 40
    mine: list[int] = []
    async with child("increment", path, str(n)) as other:
        await other.go()
        for _ in range(n):
            while True:
                cur = await store.get("counter")
                await asyncio.sleep(0.002)  # widen the window between read and write: races happen
                try:
                    new = await store.update(
                        with_counter(cur, counter_of(cur) + 1),
                        expected_revision=cur.revision,
                        transitions=[note("increment by parent")],
                    )
                except ConflictError:
                    continue
                mine.append(new.revision)
                break
        theirs = [int(line.split()[1]) for line in await other.lines_until_done()]
    final = await store.get("counter")
    assert counter_of(final) == 2 * n
    assert final.revision == 2 * n + 1
    # Exactly one process won each revision.
    assert not set(mine) & set(theirs)
    assert sorted(mine + theirs) == list(range(2, 2 * n + 2))
    history = await store.history("counter")
    assert len(history) == 2 * n + 1
    assert sum(t.what == "increment by child" for t in history) == n
    await store.close()


async def test_two_processes_racing_for_leases_get_one_holder_each(where: str) -> None:
    path = where
    store = open_at(where)
    jobs = [f"job-{i}" for i in range(30)]
    for job in jobs:
        await store.create(simple_record(job), note("created"))
    mine: set[str] = set()
    async with child("lease", path, "child", *jobs) as other:
        await other.go()
        for job in reversed(jobs):  # from the other end, so the two meet in the middle
            try:
                await store.acquire_lease(job, "parent", 3600.0)
                mine.add(job)
            except ConflictError as exc:
                assert "'child'" in str(exc)
        lines = await other.lines_until_done()
    theirs = {line.split()[1] for line in lines if line.startswith("got ")}
    assert not mine & theirs
    assert mine | theirs == set(jobs)
    for rec in await store.list():
        assert rec.lease is not None
        assert rec.lease.holder == ("parent" if rec.job_id in mine else "child")
    if theirs:
        # The child's leases are live for an hour: refused now, taken over once they have expired.
        job = sorted(theirs)[0]
        with pytest.raises(ConflictError, match="child"):
            await store.acquire_lease(job, "parent", 60.0)
        later = open_at(where, clock=ManualClock(start=time.time() + 7200))
        taken = await later.acquire_lease(job, "parent", 60.0)
        assert taken.lease is not None and taken.lease.holder == "parent"
        await later.close()
    await store.close()


@pytest.mark.parametrize("rounds", [(1, 9, 33, 80)])
async def test_a_writer_killed_mid_burst_loses_no_acknowledged_write(
    where: str, rounds: tuple[int, ...]
) -> None:
    """SIGKILL a writer after it acknowledged k writes (for several k, on one store): every acknowledged
    write is there afterwards, a SQLite file passes SQLite's integrity check, and the store works on."""
    path = where
    acknowledged: dict[str, int] = {}
    for round_no, k in enumerate(rounds):
        async with child("burst", path, f"r{round_no}") as writer:
            await writer.go()
            for _ in range(k):
                _, job, text = (await writer.line()).split()
                acknowledged[job] = int(text)
            writer.proc.send_signal(signal.SIGKILL)
            assert await writer.proc.wait() == -signal.SIGKILL

        if not where.startswith("postgresql://"):
            # The file is sound (a raw connection runs WAL recovery first, as any opener would)...
            raw = sqlite3.connect(path)
            assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
            raw.close()
        # ...and holds every acknowledged write, whole: history and record moved together.
        store = open_at(where)
        for job, rev in acknowledged.items():
            rec = await store.get(job)
            assert rec.revision >= rev, f"{job}: acknowledged revision {rev}, found {rec.revision}"
            assert counter_of(rec) == rec.revision - 1
            assert len(await store.history(job)) == rec.revision
        # It keeps working after the crash.
        probe = await store.create(simple_record(f"probe-{round_no}"), note("after the kill"))
        assert probe.revision == 1
        await store.close()


async def test_processes_opening_a_new_store_at_once_all_succeed(where: str) -> None:
    """Several processes creating the same new store race to create the schema; each must open it
    cleanly, and the migration runs exactly once (it re-checks the version under the write lock /
    the advisory lock)."""
    procs = [await spawn("lease", where, f"opener-{i}") for i in range(6)]
    try:
        for proc in procs:
            out, err = await asyncio.wait_for(proc.communicate(b"go\n"), LINE_TIMEOUT)
            assert proc.returncode == 0, err.decode(errors="replace")
            assert out.decode().split() == ["ready", "done"]
    finally:
        for proc in procs:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    store = open_at(where)
    assert await store.list() == []
    await store.close()
    if where.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(where) as conn:
            assert conn.execute("SELECT version FROM dispatch_schema").fetchall() == [(1,), (2,), (3,), (4,)]
    else:
        raw = sqlite3.connect(where)
        assert raw.execute("PRAGMA user_version").fetchone() == (3,)
        raw.close()


async def test_eight_processes_incrementing_some_killed_lose_no_acknowledged_write(where: str) -> None:
    """8 processes increment one counter with compare-and-swap; 3 are SIGKILLed mid-way. Every
    acknowledged increment is in the counter, each revision was won by exactly one process, and the
    record and its history moved together (a killed process may have committed one write it never
    got to acknowledge, no more)."""
    store = open_at(where)
    await store.create(simple_record("counter"), note("created"))
    await store.close()
    finishing, killed, each, kill_after = 5, 3, 12, 4
    async with AsyncExitStack() as stack:
        kids = [
            await stack.enter_async_context(child("increment", where, str(each if i < finishing else 10_000)))
            for i in range(finishing + killed)
        ]
        for kid in kids:
            await kid.go()
        won: list[int] = []
        for kid in kids[finishing:]:
            for _ in range(kill_after):
                won.append(int((await kid.line()).split()[1]))
            kid.proc.send_signal(signal.SIGKILL)
            assert await kid.proc.wait() == -signal.SIGKILL
            # What it printed before dying was acknowledged too (only whole lines were printed).
            assert kid.proc.stdout is not None
            rest = (await kid.proc.stdout.read()).decode()
            won.extend(int(line.split()[1]) for line in rest.splitlines(keepends=True) if line.endswith("\n"))
        for kid in kids[:finishing]:
            won.extend(int(line.split()[1]) for line in await kid.lines_until_done())
    assert len(won) == len(set(won)), "two processes won the same revision"
    store = open_at(where)
    final = await store.get("counter")
    applied = final.revision - 1
    assert set(won) <= set(range(2, final.revision + 1))
    assert len(won) <= applied <= len(won) + killed
    assert counter_of(final) == applied
    assert len(await store.history("counter")) == final.revision
    await store.close()


async def test_a_dead_supervisors_leases_are_taken_over_once_they_expire(where: str) -> None:
    """A supervisor process leases jobs for a short time and is SIGKILLed without releasing them:
    nobody else may act on them until the leases expire (by the store's clock, which for PostgreSQL is
    the server's), then another supervisor takes every one over."""
    store = open_at(where)
    jobs = [f"job-{i}" for i in range(5)]
    for job in jobs:
        await store.create(simple_record(job), note("created"))
    ttl = 10.0  # long enough for the refusals below on a loaded machine; their time is never asserted
    async with child("hold", where, str(ttl), "dead", *jobs) as dead:
        await dead.go()
        lines = [await dead.line() for _ in range(len(jobs) + 1)]
        assert lines == [f"got {job}" for job in jobs] + ["holding"]
        dead.proc.send_signal(signal.SIGKILL)
        assert await dead.proc.wait() == -signal.SIGKILL
    started = time.monotonic()
    for job in jobs:
        with pytest.raises(ConflictError, match="'dead'"):
            await store.acquire_lease(job, "heir", 60.0)
    # The leases lived ``ttl`` from their last renewal, before ``started``: after ``ttl`` more they are over.
    await asyncio.sleep(max(0.0, ttl - (time.monotonic() - started)) + 0.5)
    for job in jobs:
        rec = await store.acquire_lease(job, "heir", 60.0)
        assert rec.lease is not None and rec.lease.holder == "heir"
    await store.close()
