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
  the schema version, and ``_MIGRATIONS`` upgrades one version at a time inside one transaction.
  Records are stored as the canonical JSON of ``JobRecord.to_json()`` with indexed copies of the fields
  queries need; history is an append-only table (triggers refuse updates, and deletes while the record
  exists).
"""

from __future__ import annotations

import asyncio
import builtins
import math
import os
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from dispatch.clock import Clock, SystemClock
from dispatch.errors import ConflictError, DispatchError, InvalidError, NotFoundError, UnavailableError
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
from dispatch.records.store import Changes, Listing, check_key_value, check_leasing, read_rows

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SqliteStore"]

T = TypeVar("T")

APPLICATION_ID = 0x44535043
"""``PRAGMA application_id`` of a dispatch store ("DSPC"): tells our files from other SQLite files."""

SCHEMA_VERSION = 3
"""``PRAGMA user_version`` this code writes; older stores are migrated on open, newer ones refused."""

_SQLITE_HEADER = b"SQLite format 3\x00"
_BUSY_CODES = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED (primary codes; extended codes share the low byte)


def _schema_v1(conn: sqlite3.Connection) -> None:
    # seq is an explicit INTEGER PRIMARY KEY so creation order survives VACUUM: list() is oldest first.
    conn.execute(
        """CREATE TABLE records (
            seq INTEGER PRIMARY KEY,
            job_id TEXT NOT NULL UNIQUE,
            state TEXT NOT NULL,
            terminal INTEGER NOT NULL CHECK (terminal IN (0, 1)),
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL,
            revision INTEGER NOT NULL CHECK (revision >= 1),
            lease_holder TEXT,
            lease_expires_at REAL,
            body TEXT NOT NULL
        )"""
    )
    conn.execute("CREATE INDEX records_by_state ON records (state)")
    conn.execute("CREATE INDEX records_by_age ON records (terminal, updated_at)")
    conn.execute("CREATE INDEX records_by_lease ON records (lease_expires_at)")
    conn.execute(
        """CREATE TABLE history (
            job_id TEXT NOT NULL,
            seq INTEGER NOT NULL CHECK (seq >= 1),
            body TEXT NOT NULL,
            PRIMARY KEY (job_id, seq)
        ) WITHOUT ROWID"""
    )
    conn.execute(
        """CREATE TRIGGER history_is_append_only BEFORE UPDATE ON history
           BEGIN SELECT RAISE(ABORT, 'dispatch history is append-only'); END"""
    )
    conn.execute(
        """CREATE TRIGGER history_goes_with_its_record BEFORE DELETE ON history
           WHEN EXISTS (SELECT 1 FROM records WHERE job_id = OLD.job_id)
           BEGIN SELECT RAISE(ABORT, 'dispatch history is deleted only with its record'); END"""
    )


def _schema_v2(conn: sqlite3.Connection) -> None:
    # v2: a small key-value table beside the records (KeyValues): host caches such as probe findings.
    conn.execute("CREATE TABLE kv (key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID")


def _schema_v3(conn: sqlite3.Connection) -> None:
    # v3: a fleet of supervisors (Leasing): its members, and records found by lease holder.
    conn.execute(
        """CREATE TABLE members (grp TEXT NOT NULL, holder TEXT NOT NULL, expires_at REAL NOT NULL,
               PRIMARY KEY (grp, holder)) WITHOUT ROWID"""
    )
    conn.execute("CREATE INDEX records_by_holder ON records (lease_holder)")


_MIGRATIONS: dict[int, Callable[[sqlite3.Connection], None]] = {0: _schema_v1, 1: _schema_v2, 2: _schema_v3}
"""The migration hook: ``_MIGRATIONS[v]`` upgrades a store from schema ``v`` to ``v + 1``. Each runs in
the same transaction as the ``user_version`` bump, so a crash mid-migration leaves the old schema."""


class SqliteStore:
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
        self._path = expand_user(raw, what="path").absolute()
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._busy_timeout = float(busy_timeout)
        self._check_path()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dispatch-sqlite")
        self._conn: sqlite3.Connection | None = None  # touched only by the worker thread
        # Decoded records by job id, with the exact stored text they were decoded from (worker thread
        # only). An entry is used only when the row's text is still that text, so it can never be
        # stale; it saves the strict decode (the bulk of a list) for rows that did not change.
        self._decoded: dict[str, tuple[str, JobRecord]] = {}
        self._closed = False
        self._close_lock = threading.Lock()

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    def __repr__(self) -> str:
        return f"SqliteStore({str(self._path)!r}{', closed' if self._closed else ''})"

    # ---- opening -------------------------------------------------------------------------------

    def _check_path(self) -> None:
        where = str(self._path)
        if self._path.is_dir():
            raise InvalidError(
                f"is a directory; give the path of the store file inside it (e.g. {self._path / 'jobs.db'})",
                path=where,
            )
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise InvalidError(
                f"cannot create the store's directory {self._path.parent}: a file is in the way", path=where
            ) from None
        except OSError as exc:
            raise UnavailableError(
                f"{where}: cannot create the store's directory {self._path.parent}: {exc.strerror}"
            ) from None
        try:
            with open(self._path, "rb") as f:
                head = f.read(len(_SQLITE_HEADER))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise UnavailableError(f"{where}: cannot read the store file: {exc.strerror}") from None
        if head and head != _SQLITE_HEADER:
            raise InvalidError("is not a SQLite database, so it is not a dispatch store", path=where)

    def _connection(self) -> sqlite3.Connection:
        """The worker thread's connection, opened (and the schema created or migrated) on first use."""
        if self._conn is None:
            conn = sqlite3.connect(
                self._path, timeout=self._busy_timeout, isolation_level=None, check_same_thread=True
            )
            try:
                self._prepare(conn)
            except BaseException:
                conn.close()
                raise
            self._conn = conn
        return self._conn

    def _prepare(self, conn: sqlite3.Connection) -> None:
        # Look before changing anything: a foreign database must not be switched to WAL or written.
        # One read transaction, so a concurrent opener's migration is seen whole or not at all.
        self._transaction(conn, self._check_read_identity, write=False)
        mode = self._busy_retry(lambda: conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
        if str(mode).lower() != "wal":
            raise UnavailableError(
                f"{self._path}: cannot use write-ahead logging here (journal mode stays {mode!r}); "
                "put the store on a local filesystem"
            )
        conn.execute("PRAGMA synchronous=FULL")
        if self._busy_retry(lambda: self._pragma(conn, "user_version")) < SCHEMA_VERSION:
            self._transaction(conn, self._migrate, write=True)

    def _busy_retry(self, fn: Callable[[], T]) -> T:
        """``fn()``, retried while SQLite answers busy, until ``busy_timeout`` has passed.

        Switching a new store to WAL while another process holds a write lock on it (its own first
        open) fails at once with SQLITE_BUSY: SQLite does not call its busy handler there, since
        waiting could deadlock. Waiting outside any transaction cannot."""
        deadline = time.monotonic() + self._busy_timeout
        pause = 0.002
        while True:
            try:
                return fn()
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode & 0xFF not in _BUSY_CODES or time.monotonic() >= deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.05)

    @staticmethod
    def _pragma(conn: sqlite3.Connection, name: str) -> int:
        return int(conn.execute(f"PRAGMA {name}").fetchone()[0])

    def _check_read_identity(self, conn: sqlite3.Connection) -> None:
        self._check_identity(conn, self._pragma(conn, "application_id"), self._pragma(conn, "user_version"))

    def _check_identity(self, conn: sqlite3.Connection, app_id: int, version: int) -> None:
        where = str(self._path)
        if app_id == APPLICATION_ID:
            if version > SCHEMA_VERSION:
                raise InvalidError(
                    f"was written by a newer dispatch (schema version {version}; this one knows up to "
                    f"{SCHEMA_VERSION}); upgrade dispatch to use it",
                    path=where,
                )
            return
        tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE name NOT LIKE 'sqlite_%'").fetchone()[
            0
        ]
        if app_id != 0 or version != 0 or tables:
            raise InvalidError(
                "is a SQLite database but not a dispatch store (it has other tables or another application id)",
                path=where,
            )

    def _migrate(self, conn: sqlite3.Connection) -> None:
        # Re-read inside the write transaction: another process may have migrated since we looked.
        version = self._pragma(conn, "user_version")
        self._check_identity(conn, self._pragma(conn, "application_id"), version)
        while version < SCHEMA_VERSION:
            _MIGRATIONS[version](conn)
            version += 1
            conn.execute(f"PRAGMA user_version = {version:d}")
        conn.execute(f"PRAGMA application_id = {APPLICATION_ID:d}")

    # ---- running calls in the worker thread ---------------------------------------------------

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._closed:
            raise UnavailableError(f"{self._path}: the store is closed")
        loop = asyncio.get_running_loop()
        try:
            fut = loop.run_in_executor(self._executor, self._call, fn)
        except RuntimeError:  # the executor was shut down by a concurrent close()
            raise UnavailableError(f"{self._path}: the store is closed") from None
        return await fut

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        started = time.monotonic()
        try:
            return fn(self._connection())
        except sqlite3.Error as exc:
            raise self._mapped(exc, time.monotonic() - started) from exc

    def _transaction(
        self, conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T], *, write: bool
    ) -> T:
        """Run ``body`` in one transaction, retrying while another connection holds the lock (bounded
        by ``busy_timeout``). Any failure rolls back, so a call applies whole or not at all."""
        deadline = time.monotonic() + self._busy_timeout
        pause = 0.002
        while True:
            try:
                conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
                try:
                    result = body(conn)
                    conn.execute("COMMIT")
                except BaseException:
                    self._rollback(conn)
                    raise
                return result
            except sqlite3.OperationalError as exc:
                if exc.sqlite_errorcode & 0xFF not in _BUSY_CODES or time.monotonic() >= deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 0.05)

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the original error is the one worth reporting; SQLite rolls back on close anyway

    def _mapped(self, exc: sqlite3.Error, waited: float) -> DispatchError:
        where = str(self._path)
        name = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
        if name == "SQLITE_NOTADB":
            return InvalidError("is not a SQLite database, so it is not a dispatch store", path=where)
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            # Say how long we really waited: SQLite gives up at once where waiting could deadlock.
            return UnavailableError(
                f"{where}: the store stayed locked by another connection; gave up after {waited:.2f}s "
                f"(busy_timeout {self._busy_timeout:g}s)"
            )
        if name.startswith("SQLITE_CORRUPT"):
            return UnavailableError(
                f"{where}: the database file is corrupt ({exc}); move it away or restore a backup"
            )
        if name.startswith(("SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_READONLY", "SQLITE_AUTH")):
            return UnavailableError(f"{where}: cannot open or write the store file ({exc})")
        return UnavailableError(f"{where}: {exc} ({name})")

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
        record = decode_record(job_id, text, str(self._path))
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

        return await self._run(lambda conn: self._transaction(conn, body, write=True))

    async def get(self, job_id: str) -> JobRecord:
        """The current record. ``NotFoundError`` if there is none."""
        check_job_id(job_id)
        return await self._run(
            lambda conn: self._transaction(conn, lambda c: self._current(c, job_id), write=False)
        )

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

        return await self._run(lambda conn: self._transaction(conn, body, write=False))

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

        return await self._run(lambda conn: self._transaction(conn, body, write=True))

    async def history(self, job_id: str) -> builtins.list[Transition]:
        """The record's transitions, oldest first. ``NotFoundError`` if there is no record."""
        check_job_id(job_id)

        def body(conn: sqlite3.Connection) -> builtins.list[Transition]:
            if conn.execute("SELECT 1 FROM records WHERE job_id = ?", (job_id,)).fetchone() is None:
                raise NotFoundError(f"no record for job {job_id!r}")
            rows = conn.execute("SELECT seq, body FROM history WHERE job_id = ? ORDER BY seq", (job_id,))
            where = str(self._path)
            return [decode_transition(job_id, seq, text, where) for seq, text in rows.fetchall()]

        return await self._run(lambda conn: self._transaction(conn, body, write=False))

    async def acquire_lease(self, job_id: str, holder: str, ttl: float) -> JobRecord:
        """Take or renew the lease on a record for ``ttl`` seconds. Succeeds when there is no lease, it
        has expired, or ``holder`` already holds it; otherwise ``ConflictError`` naming the holder."""
        check_job_id(job_id)
        check_holder(holder)
        seconds = check_ttl(ttl)

        def body(conn: sqlite3.Connection) -> JobRecord:
            current = self._current(conn, job_id)
            now = self._clock.now()
            lease = lease_after_acquire(job_id, current.lease, holder, seconds, now)
            stored = current.replace(lease=lease, revision=current.revision + 1, updated_at=now)
            self._replace_row(conn, stored)
            return stored

        return await self._run(lambda conn: self._transaction(conn, body, write=True))

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

        return await self._run(lambda conn: self._transaction(conn, body, write=True))

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

        return await self._run(lambda conn: self._transaction(conn, body, write=True))

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
        return _SqliteChanges(self, float(interval))

    async def heartbeat(self, group: str, holder: str, ttl: float) -> builtins.list[str]:
        """Mark ``holder`` a live member of ``group`` for ``ttl`` seconds; the live members, sorted
        (see :class:`~dispatch.records.store.Leasing`)."""
        check_leasing(group, holder)
        seconds = check_ttl(ttl)

        def body(conn: sqlite3.Connection) -> builtins.list[str]:
            now = self._clock.now()
            conn.execute(
                "INSERT OR REPLACE INTO members (grp, holder, expires_at) VALUES (?, ?, ?)",
                (group, holder, now + seconds),
            )
            conn.execute("DELETE FROM members WHERE expires_at <= ?", (now,))
            rows = conn.execute("SELECT holder FROM members WHERE grp = ? ORDER BY holder", (group,))
            return [str(r[0]) for r in rows.fetchall()]

        return await self._run(lambda conn: self._transaction(conn, body, write=True))

    async def leasable(self, holder: str, *, states: Iterable[State], limit: int, after: str = "") -> Listing:
        """The records ``holder`` leases, then a page of at most ``limit`` claimable ones in ``states``
        after ``after``, by job id (see :class:`~dispatch.records.store.Leasing`)."""
        check_leasing("-", holder, limit)
        wanted = sorted(s.value for s in check_states(states) or ())
        marks = ", ".join("?" for _ in wanted)

        def body(conn: sqlite3.Connection) -> Listing:
            held = conn.execute(
                "SELECT job_id, body FROM records WHERE lease_holder = ? ORDER BY job_id", (holder,)
            ).fetchall()
            free = conn.execute(
                f"""SELECT job_id, body FROM records
                    WHERE state IN ({marks}) AND job_id > ? AND lease_holder IS NOT ?
                      AND (lease_holder IS NULL OR lease_expires_at <= ?)
                    ORDER BY job_id LIMIT ?""",
                (*wanted, str(after), holder, self._clock.now(), limit),
            ).fetchall()
            return read_rows([*held, *free], self._decode)

        return await self._run(lambda conn: self._transaction(conn, body, write=False))

    async def renew_leases(self, holder: str, ttl: float, job_ids: Iterable[str]) -> builtins.list[JobRecord]:
        """Renew ``holder``'s leases on ``job_ids`` in one transaction; the records renewed."""
        check_holder(holder)
        seconds = check_ttl(ttl)
        ids = [check_job_id(j) for j in job_ids]

        def body(conn: sqlite3.Connection) -> builtins.list[JobRecord]:
            now = self._clock.now()
            out: builtins.list[JobRecord] = []
            for job_id in ids:
                row = conn.execute(
                    "SELECT body FROM records WHERE job_id = ? AND lease_holder = ?", (job_id, holder)
                ).fetchone()
                if row is None:
                    continue
                current = self._decode(job_id, row[0])
                lease = lease_after_acquire(job_id, current.lease, holder, seconds, now)
                stored = current.replace(lease=lease, revision=current.revision + 1, updated_at=now)
                self._replace_row(conn, stored)
                out.append(stored)
            return out

        return await self._run(lambda conn: self._transaction(conn, body, write=True))

    async def get_value(self, key: str) -> str | None:
        """The value kept under ``key`` (see :class:`~dispatch.records.store.KeyValues`), or ``None``."""
        check_key_value(key, None)

        def body(conn: sqlite3.Connection) -> str | None:
            row = conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()
            return None if row is None else str(row[0])

        return await self._run(lambda conn: self._transaction(conn, body, write=False))

    async def put_value(self, key: str, value: str | None) -> None:
        """Keep ``value`` under ``key``; ``None`` removes it."""
        check_key_value(key, value)

        def body(conn: sqlite3.Connection) -> None:
            if value is None:
                conn.execute("DELETE FROM kv WHERE key = ?", (key,))
            else:
                conn.execute("INSERT OR REPLACE INTO kv (key, value) VALUES (?, ?)", (key, value))

        await self._run(lambda conn: self._transaction(conn, body, write=True))

    async def add_value(self, key: str, value: str) -> str:
        """Keep ``value`` under ``key`` unless a value is there already; return the value kept."""
        check_key_value(key, value)

        def body(conn: sqlite3.Connection) -> str:
            conn.execute("INSERT OR IGNORE INTO kv (key, value) VALUES (?, ?)", (key, value))
            return str(conn.execute("SELECT value FROM kv WHERE key = ?", (key,)).fetchone()[0])

        return await self._run(lambda conn: self._transaction(conn, body, write=True))

    async def close(self) -> None:
        """Finish the calls already made, close the file and stop the worker thread. Idempotent."""
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._disconnect)
        finally:
            self._executor.shutdown(wait=False)

    def _disconnect(self) -> None:
        self._decoded.clear()
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


class _SqliteChanges(Changes):
    """The polling change feed of :meth:`SqliteStore.changes` (its own connection, used from
    ``asyncio.to_thread`` one call at a time)."""

    def __init__(self, store: SqliteStore, interval: float) -> None:
        self._store = store
        self._interval = interval
        self._conn: sqlite3.Connection | None = None
        self._version = -1
        self._seen: dict[str, tuple[int, int, float]] = {}
        self._pending: deque[str] = deque()

    async def _start(self) -> None:
        await self._store._run(lambda conn: None)  # the file exists and has our schema
        await self._blocking(self._open)

    async def _blocking(self, fn: Callable[[], T]) -> T:
        started = time.monotonic()
        try:
            return await asyncio.to_thread(fn)
        except sqlite3.Error as exc:
            raise self._store._mapped(exc, time.monotonic() - started) from None

    def _open(self) -> None:
        self._conn = sqlite3.connect(
            self._store.path, timeout=self._store._busy_timeout, isolation_level=None, check_same_thread=False
        )
        self._poll()  # the starting point: changes after this are reported

    def _poll(self) -> list[str]:
        conn = self._conn
        if conn is None:
            raise UnavailableError(f"{self._store.path}: the change feed is closed")
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
            if self._store._closed:
                raise UnavailableError(f"{self._store.path}: the store is closed; its change feed ended")
            await asyncio.sleep(self._interval)
            self._pending.extend(await self._blocking(self._poll))
        return self._pending.popleft()

    async def _stop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.to_thread(conn.close)
