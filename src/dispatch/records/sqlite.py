"""The embedded :class:`~dispatch.records.Store`: one SQLite file, shared safely by the processes of
one host.

Design, and why:

- **WAL journal, ``synchronous=FULL``.** WAL lets readers run while one process writes. With FULL,
  every commit is fsynced to the WAL before ``COMMIT`` returns, so an acknowledged write survives the
  process being killed *and* the machine losing power. (NORMAL would survive a process kill — the
  committed frames are already in the OS page cache — but could lose the last commits on power loss;
  a job record is a promise about a job that may be running on a cluster, so we pay the fsync.)
- **``BEGIN IMMEDIATE`` for every write**: the write lock is taken before the revision is read, so a
  compare-and-swap cannot interleave with another process's. Waiting for the lock uses SQLite's busy
  handler (``busy_timeout``) plus a bounded retry; past the bound the call raises ``UnavailableError``.
- **One worker thread and one connection per store**: sqlite3 calls block, so they never run on the
  event loop. Calls run one at a time, in order. A cancelled call either never started or runs to its
  end in the worker — its transaction commits whole or not at all; the caller just does not learn
  which.
- **Schema**: ``PRAGMA application_id`` marks the file as a dispatch store, ``PRAGMA user_version`` is
  the schema version, and ``_MIGRATIONS`` upgrades one version at a time inside one transaction
  (:mod:`dispatch.records.sqlite_file`: the file, its worker thread, its transactions and errors).
  Records are stored as the canonical JSON of ``JobRecord.to_json()`` with indexed copies of the fields
  queries need; history is an append-only table (triggers refuse updates, and deletes while the record
  exists).
- **The fleet's queries** (:class:`~dispatch.records.Leasing`) are :mod:`dispatch.records.sqlite_leasing`'s.
"""

from __future__ import annotations

import asyncio
import builtins
import math
import os
import sqlite3
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

from dispatch.clock import Clock, SystemClock
from dispatch.errors import ConflictError, InvalidError, NotFoundError, UnavailableError
from dispatch.model import JobRecord, State, Transition, check_job_id
from dispatch.records._common import (
    check_cutoff,
    check_holder,
    check_revision,
    check_states,
    check_ttl,
    checked_record,
    checked_transition,
    checked_transitions,
    decode_record,
    decode_transition,
    lease_after_acquire,
    lease_after_release,
    record_text,
)
from dispatch.records.paths import expand_user
from dispatch.records.sqlite_file import APPLICATION_ID, SCHEMA_VERSION, SqliteFile
from dispatch.records.sqlite_leasing import SqliteLeasing
from dispatch.records.store import Changes, Listing, check_key_value, read_rows

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SqliteStore"]

T = TypeVar("T")


class SqliteStore(SqliteLeasing):
    """Job records in one SQLite file (WAL mode), safe for several processes on one host.

    ``path`` is the database file; missing parent directories are created. ``clock`` stamps
    ``updated_at`` and judges lease expiry (default: the system clock). ``busy_timeout`` bounds how long
    a call waits for another process's lock before raising ``UnavailableError``.

    The file is opened (and created or migrated) by the first call, in the store's worker thread.
    A path that is a directory, or a file that is not a SQLite database, is refused at once with
    ``InvalidError``; a SQLite file that is not a dispatch store, or one written by a newer dispatch,
    with ``InvalidError`` at the first call; an unreadable or corrupt file with ``UnavailableError``.
    Every error names the path.
    """

    def __init__(
        self, path: str | os.PathLike[str], *, clock: Clock | None = None, busy_timeout: float = 30.0
    ) -> None:
        try:
            raw: object = os.fspath(path)
        except TypeError:
            raw = path
        if not isinstance(raw, str) or not raw or raw == ":memory:" or raw.startswith("file:"):
            raise InvalidError(
                f"expected the path of a store file, got {raw!r} (for an in-process store use MemoryStore)",
                path="path",
            )
        if (
            isinstance(busy_timeout, bool)
            or not isinstance(busy_timeout, int | float)
            or not math.isfinite(busy_timeout)
            or busy_timeout <= 0
        ):
            raise InvalidError(
                f"expected a positive number of seconds, got {busy_timeout!r}", path="busy_timeout"
            )
        self._file = SqliteFile(expand_user(raw, what="path").absolute(), float(busy_timeout))
        self._clock: Clock = clock if clock is not None else SystemClock()
        # Decoded records by job id, with the exact stored text they were decoded from (worker thread
        # only). An entry is used only when the row's text is still that text, so it can never be
        # stale; it saves the strict decode (the bulk of a list) for rows that did not change.
        self._decoded: dict[str, tuple[str, JobRecord]] = {}

    @property
    def path(self) -> Path:
        """The database file."""
        return self._file.path

    def __repr__(self) -> str:
        return f"SqliteStore({str(self.path)!r}{', closed' if self._file.closed else ''})"

    # ---- rows ----------------------------------------------------------------------------------

    def _current(self, conn: sqlite3.Connection, job_id: str) -> JobRecord:
        row = conn.execute("SELECT body FROM records WHERE job_id = ?", (job_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no record for job {job_id!r}")
        return self._decode(job_id, row[0])

    def _decode(self, job_id: str, text: str) -> JobRecord:
        hit = self._decoded.get(job_id)
        if hit is not None and hit[0] == text:
            return hit[1]
        record = decode_record(job_id, text, str(self.path))
        self._remember(text, record)
        return record

    def _remember(self, text: str, record: JobRecord) -> None:
        self._decoded[record.job_id] = (text, record)

    def _columns(self, record: JobRecord) -> tuple[object, ...]:
        lease = record.lease
        text = record_text(record)
        self._remember(text, record)  # harmless if the transaction then rolls back: keyed by text
        return (
            record.outcome.state.value,
            int(record.outcome.state.terminal),
            record.created_at,
            record.updated_at,
            record.revision,
            lease.holder if lease is not None else None,
            lease.expires_at if lease is not None else None,
            text,
        )

    def _replace_row(self, conn: sqlite3.Connection, record: JobRecord) -> None:
        conn.execute(
            """UPDATE records SET state = ?, terminal = ?, created_at = ?, updated_at = ?, revision = ?,
                   lease_holder = ?, lease_expires_at = ?, body = ?
               WHERE job_id = ?""",
            (*self._columns(record), record.job_id),
        )

    # ---- the Store protocol --------------------------------------------------------------------

    async def create(self, record: JobRecord, transition: Transition) -> JobRecord:
        """Insert a new record (stored with revision 1) and its first transition.
        ``ConflictError`` if the job id is taken."""
        checked = checked_record(record)
        _, first = checked_transition(checked.job_id, transition, "transition")

        def body(conn: sqlite3.Connection) -> JobRecord:
            if conn.execute("SELECT 1 FROM records WHERE job_id = ?", (checked.job_id,)).fetchone():
                raise ConflictError(f"a record for job {checked.job_id!r} already exists")
            stored = checked.replace(revision=1, updated_at=self._clock.now())
            conn.execute(
                """INSERT INTO records (state, terminal, created_at, updated_at, revision, lease_holder,
                       lease_expires_at, body, job_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                (*self._columns(stored), stored.job_id),
            )
            conn.execute("INSERT INTO history (job_id, seq, body) VALUES (?, 1, ?)", (stored.job_id, first))
            return stored

        return await self._file.write(body)

    async def get(self, job_id: str) -> JobRecord:
        """The current record. ``NotFoundError`` if there is none."""
        check_job_id(job_id)
        return await self._file.read(lambda c: self._current(c, job_id))

    async def list(self, *, states: Iterable[State] | None = None) -> Listing:
        """Every record (optionally only those in ``states``), oldest first; unreadable ones aside."""
        wanted = check_states(states)

        def body(conn: sqlite3.Connection) -> Listing:
            if wanted is None:
                rows = conn.execute("SELECT job_id, body FROM records ORDER BY seq").fetchall()
            else:
                marks = ", ".join("?" for _ in wanted)
                rows = conn.execute(
                    f"SELECT job_id, body FROM records WHERE state IN ({marks}) ORDER BY seq",
                    sorted(s.value for s in wanted),
                ).fetchall()
            return read_rows(rows, self._decode)

        return await self._file.read(body)

    async def update(
        self, record: JobRecord, *, expected_revision: int, transitions: Sequence[Transition] = ()
    ) -> JobRecord:
        """Replace the record if its stored revision is ``expected_revision``, appending ``transitions``
        atomically with it. ``ConflictError`` if the revision moved, ``NotFoundError`` if it is gone.

        The stored ``created_at`` and lease are kept: the lease changes only through
        :meth:`acquire_lease` and :meth:`release_lease`."""
        checked = checked_record(record)
        added = checked_transitions(checked.job_id, transitions)
        check_revision(expected_revision)

        def body(conn: sqlite3.Connection) -> JobRecord:
            current = self._current(conn, checked.job_id)
            if current.revision != expected_revision:
                raise ConflictError(
                    f"job {checked.job_id!r} is at revision {current.revision}, not {expected_revision}: "
                    "it changed since it was read"
                )
            stored = checked.replace(
                revision=current.revision + 1,
                updated_at=self._clock.now(),
                created_at=current.created_at,
                lease=current.lease,
            )
            self._replace_row(conn, stored)
            if added:
                last = conn.execute(
                    "SELECT coalesce(max(seq), 0) FROM history WHERE job_id = ?", (checked.job_id,)
                ).fetchone()[0]
                conn.executemany(
                    "INSERT INTO history (job_id, seq, body) VALUES (?, ?, ?)",
                    [(checked.job_id, last + i, text) for i, (_, text) in enumerate(added, start=1)],
                )
            return stored

        return await self._file.write(body)

    async def history(self, job_id: str) -> builtins.list[Transition]:
        """The record's transitions, oldest first. ``NotFoundError`` if there is no record."""
        check_job_id(job_id)

        def body(conn: sqlite3.Connection) -> builtins.list[Transition]:
            if conn.execute("SELECT 1 FROM records WHERE job_id = ?", (job_id,)).fetchone() is None:
                raise NotFoundError(f"no record for job {job_id!r}")
            rows = conn.execute("SELECT seq, body FROM history WHERE job_id = ? ORDER BY seq", (job_id,))
            where = str(self.path)
            return [decode_transition(job_id, seq, text, where) for seq, text in rows.fetchall()]

        return await self._file.read(body)

    async def acquire_lease(self, job_id: str, holder: str, ttl: float) -> JobRecord:
        """Take or renew the lease on a record for ``ttl`` seconds. Succeeds when there is no lease, it
        has expired, or ``holder`` already holds it; otherwise ``ConflictError`` naming the holder."""
        check_job_id(job_id)
        check_holder(holder)
        seconds = check_ttl(ttl)

        return await self._file.write(lambda conn: self._acquire(conn, job_id, holder, seconds))

    def _acquire(self, conn: sqlite3.Connection, job_id: str, holder: str, seconds: float) -> JobRecord:
        current = self._current(conn, job_id)
        now = self._clock.now()
        lease = lease_after_acquire(job_id, current.lease, holder, seconds, now)
        stored = current.replace(lease=lease, revision=current.revision + 1, updated_at=now)
        self._replace_row(conn, stored)
        return stored

    async def release_lease(self, job_id: str, holder: str) -> JobRecord:
        """Give up a lease held by ``holder``. ``ConflictError`` if another holder has it now.
        Releasing when nobody holds a live lease changes nothing (and does not bump the revision)."""
        check_job_id(job_id)
        check_holder(holder)

        def body(conn: sqlite3.Connection) -> JobRecord:
            current = self._current(conn, job_id)
            now = self._clock.now()
            changed, lease = lease_after_release(job_id, current.lease, holder, now)
            if not changed:
                return current
            stored = current.replace(lease=lease, revision=current.revision + 1, updated_at=now)
            self._replace_row(conn, stored)
            return stored

        return await self._file.write(body)

    async def purge(self, older_than: float) -> int:
        """Delete terminal records (and their history) last updated before ``older_than`` (epoch
        seconds). Returns how many were deleted. Non-terminal records are never purged, nor records
        under a live lease."""
        cutoff = check_cutoff(older_than)

        def body(conn: sqlite3.Connection) -> int:
            now = self._clock.now()
            doomed = [
                (job_id,)
                for (job_id,) in conn.execute(
                    """SELECT job_id FROM records WHERE terminal = 1 AND updated_at < ?
                       AND (lease_expires_at IS NULL OR lease_expires_at <= ?)""",
                    (cutoff, now),
                ).fetchall()
            ]
            # Records first: the history trigger allows deleting history only once its record is gone.
            conn.executemany("DELETE FROM records WHERE job_id = ?", doomed)
            conn.executemany("DELETE FROM history WHERE job_id = ?", doomed)
            for (job_id,) in doomed:
                self._decoded.pop(job_id, None)
            return len(doomed)

        return await self._file.write(body)

    def changes(self, *, interval: float = 0.05) -> Changes:
        """Subscribe to the file's writes, by any process (see :class:`~dispatch.records.Changes`).

        SQLite has no notifications, so the feed polls: every ``interval`` seconds it asks the file's
        ``PRAGMA data_version`` (one cheap call, which moves when any other connection commits) and,
        only when it moved, compares each record's revision with what it saw before. Latency is up to
        ``interval``; an idle store costs one pragma per interval."""
        if (
            isinstance(interval, bool)
            or not isinstance(interval, int | float)
            or not math.isfinite(interval)
            or interval <= 0
        ):
            raise InvalidError(f"expected a positive number of seconds, got {interval!r}", path="interval")
        return _SqliteChanges(self._file, float(interval))

    async def get_value(self, key: str) -> str | None:
        """The value kept under ``key`` (see :class:`~dispatch.records.store.KeyValues`), or ``None``."""
        check_key_value(key, None)

        def body(conn: sqlite3.Connection) -> str | None:
            row = conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
            return None if row is None else str(row[0])

        return await self._file.read(body)

    async def put_value(self, key: str, value: str | None) -> None:
        """Keep ``value`` under ``key``; ``None`` removes it."""
        check_key_value(key, value)

        def body(conn: sqlite3.Connection) -> None:
            if value is None:
                conn.execute("DELETE FROM kv WHERE key = ?", (key,))
            else:
                conn.execute("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", (key, value))

        await self._file.write(body)

    async def add_value(self, key: str, value: str) -> str:
        """Keep ``value`` under ``key`` unless a value is there already; return the value kept."""
        check_key_value(key, value)

        def body(conn: sqlite3.Connection) -> str:
            conn.execute("INSERT OR IGNORE INTO kv (key, value) VALUES (?, ?)", (key, value))
            return str(conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()[0])

        return await self._file.write(body)

    async def close(self) -> None:
        """Finish the calls already made, close the file and stop the worker thread. Idempotent."""
        await self._file.close(self._decoded.clear)


class _SqliteChanges(Changes):
    """The polling change feed of :meth:`SqliteStore.changes` (its own connection, used from
    ``asyncio.to_thread`` one call at a time)."""

    def __init__(self, file: SqliteFile, interval: float) -> None:
        self._file = file
        self._interval = interval
        self._conn: sqlite3.Connection | None = None
        self._version = -1
        self._seen: dict[str, tuple[int, int, float]] = {}
        self._pending: deque[str] = deque()

    async def _start(self) -> None:
        await self._file.run(lambda conn: None)  # the file exists and has our schema
        await self._blocking(self._open)

    async def _blocking(self, fn: Callable[[], T]) -> T:
        started = time.monotonic()
        try:
            return await asyncio.to_thread(fn)
        except sqlite3.Error as exc:
            raise self._file.mapped(exc, time.monotonic() - started) from None

    def _open(self) -> None:
        self._conn = sqlite3.connect(
            self._file.path, timeout=self._file.busy_timeout, isolation_level=None, check_same_thread=False
        )
        self._poll()  # the starting point: changes after this are reported

    def _poll(self) -> list[str]:
        conn = self._conn
        if conn is None:
            raise UnavailableError(f"{self._file.path}: the change feed is closed")
        # The version first: a commit landing between the two reads is then seen again next time
        # (reported twice at worst), never missed.
        version = int(conn.execute("PRAGMA data_version").fetchone()[0])
        if version == self._version:
            return []
        self._version = version
        now = {
            job_id: (seq, revision, updated_at)
            for job_id, seq, revision, updated_at in conn.execute(
                "SELECT job_id, seq, revision, updated_at FROM records"
            )
        }
        old, self._seen = self._seen, now
        changed = [job_id for job_id, key in now.items() if old.get(job_id) != key]
        changed.extend(job_id for job_id in old if job_id not in now)
        return changed

    async def _next(self) -> str:
        while not self._pending:
            if self._file.closed:
                raise UnavailableError(f"{self._file.path}: the store is closed; its change feed ended")
            await asyncio.sleep(self._interval)
            self._pending.extend(await self._blocking(self._poll))
        return self._pending.popleft()

    async def _stop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.to_thread(conn.close)
