"""Several processes on one SQLite store: compare-and-swap, leases, and a writer killed mid-burst.

The other process is ``records_child.py``; it prints a line for every write after the call returned
(flushed), so the parent knows exactly which writes were acknowledged.
"""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from records_samples import counter_of, note, simple_record, with_counter

from dispatch import ConflictError, ManualClock
from dispatch.records import SqliteStore

CHILD = Path(__file__).with_name("records_child.py")
LINE_TIMEOUT = 60.0  # generous: only guards against a hung child, never part of an assertion

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="uses SIGKILL")


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
async def child(mode: str, path: Path, *args: str) -> AsyncIterator[Child]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        mode,
        str(path),
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    c = Child(proc)
    try:
        assert await c.line() == "ready"
        yield c
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_two_processes_incrementing_lose_no_update(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path)
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


async def test_two_processes_racing_for_leases_get_one_holder_each(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = SqliteStore(path)
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
        later = SqliteStore(path, clock=ManualClock(start=time.time() + 7200))
        taken = await later.acquire_lease(job, "parent", 60.0)
        assert taken.lease is not None and taken.lease.holder == "parent"
        await later.close()
    await store.close()


@pytest.mark.parametrize("rounds", [(1, 9, 33, 80)])
async def test_a_writer_killed_mid_burst_loses_no_acknowledged_write(
    tmp_path: Path, rounds: tuple[int, ...]
) -> None:
    """SIGKILL a writer after it acknowledged k writes (for several k, on one file): every acknowledged
    write is there afterwards, the file passes SQLite's integrity check, and the store works on."""
    path = tmp_path / "jobs.db"
    acknowledged: dict[str, int] = {}
    for round_no, k in enumerate(rounds):
        async with child("burst", path, f"r{round_no}") as writer:
            await writer.go()
            for _ in range(k):
                _, job, text = (await writer.line()).split()
                acknowledged[job] = int(text)
            writer.proc.send_signal(signal.SIGKILL)
            assert await writer.proc.wait() == -signal.SIGKILL

        # The file is sound (a raw connection runs WAL recovery first, as any opener would)...
        raw = sqlite3.connect(path)
        assert raw.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        raw.close()
        # ...and holds every acknowledged write, whole: history and record moved together.
        store = SqliteStore(path)
        for job, rev in acknowledged.items():
            rec = await store.get(job)
            assert rec.revision >= rev, f"{job}: acknowledged revision {rev}, found {rec.revision}"
            assert counter_of(rec) == rec.revision - 1
            assert len(await store.history(job)) == rec.revision
        # It keeps working after the crash.
        probe = await store.create(simple_record(f"probe-{round_no}"), note("after the kill"))
        assert probe.revision == 1
        await store.close()


async def test_processes_opening_a_new_store_at_once_all_succeed(tmp_path: Path) -> None:
    """Several processes creating the same new store file race to switch it to WAL and create the
    schema; each must open it cleanly (the migration re-checks the version under the write lock)."""
    path = tmp_path / "new" / "jobs.db"
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(CHILD),
            "lease",
            str(path),
            f"opener-{i}",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        for i in range(6)
    ]
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
    store = SqliteStore(path)
    assert await store.list() == []
    await store.close()
