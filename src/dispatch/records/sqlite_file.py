"""The file under a :class:`~dispatch.records.SqliteStore`: :class:`SqliteFile`.

Opening it (the path checked, the schema created or migrated, write-ahead logging switched on), its one
worker thread and connection, transactions retried while another process holds the lock, and SQLite's
errors mapped to dispatch's, each naming the file. Why it is done this way: the store's module docstring.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from dispatch.errors import DispatchError, InvalidError, UnavailableError

__all__ = ["APPLICATION_ID", "SCHEMA_VERSION", "SqliteFile"]

T = TypeVar("T")

APPLICATION_ID = 0x44535043
"""``PRAGMA application_id`` of a dispatch store ("DSPC"): tells our files from other SQLite files."""

SCHEMA_VERSION = 3
"""``PRAGMA user_version`` this code writes; older stores are migrated on open, newer ones refused."""

_SQLITE_HEADER = b"SQLite format 3\x00"
_BUSY_CODES = (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED (primary codes; extended codes share the low byte)


class SqliteFile:
    """One store file, opened (and created or migrated) by the first call, in its worker thread.
    ``busy_timeout`` bounds how long a call waits for another process's lock."""

    def __init__(self, path: Path, busy_timeout: float) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        self._check_path()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dispatch-sqlite")
        self._conn: sqlite3.Connection | None = None  # touched only by the worker thread
        self.closed = False
        self._close_lock = threading.Lock()

    # ---- opening -------------------------------------------------------------------------------

    def _check_path(self) -> None:
        where = str(self.path)
        if self.path.is_dir():
            raise InvalidError(
                f"is a directory; give the path of the store file inside it (e.g. {self.path / 'jobs.db'})",
                path=where,
            )
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise InvalidError(
                f"cannot create the store's directory {self.path.parent}: a file is in the way", path=where
            ) from None
        except OSError as exc:
            raise UnavailableError(
                f"{where}: cannot create the store's directory {self.path.parent}: {exc.strerror}"
            ) from None
        try:
            with open(self.path, "rb") as f:
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
                self.path, timeout=self.busy_timeout, isolation_level=None, check_same_thread=True
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
                f"{self.path}: cannot use write-ahead logging here (journal mode stays {mode!r}); "
                "put the store on a local filesystem"
            )
        conn.execute("PRAGMA synchronous=FULL")
        if self._busy_retry(lambda: self._pragma(conn, "user_version")) < SCHEMA_VERSION:
            self._transaction(conn, self._migrate, write=True)

    def _busy_retry(self, fn: Callable[[], T]) -> T:
        """``fn()``, retried while SQLite answers busy, until ``busy_timeout`` has passed: a transaction
        beginning while another connection holds the lock, and switching a new store to WAL while
        another process holds a write lock on it (its own first open), which fails at once with
        SQLITE_BUSY: SQLite does not call its busy handler there, since waiting could deadlock. Waiting
        outside any transaction cannot."""
        deadline = time.monotonic() + self.busy_timeout
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
        where = str(self.path)
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

    async def run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``fn(connection)`` in the worker thread; SQLite's errors mapped to dispatch's."""
        if self.closed:
            raise UnavailableError(f"{self.path}: the store is closed")
        loop = asyncio.get_running_loop()
        try:
            fut = loop.run_in_executor(self._executor, self._call, fn)
        except RuntimeError:  # the executor was shut down by a concurrent close()
            raise UnavailableError(f"{self.path}: the store is closed") from None
        return await fut

    def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        started = time.monotonic()
        try:
            return fn(self._connection())
        except sqlite3.Error as exc:
            raise self.mapped(exc, time.monotonic() - started) from exc

    def _transaction(
        self, conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T], *, write: bool
    ) -> T:
        """Run ``body`` in one transaction, retrying while another connection holds the lock (bounded
        by ``busy_timeout``). Any failure rolls back, so a call applies whole or not at all."""

        def attempt() -> T:
            conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
            try:
                result = body(conn)
                conn.execute("COMMIT")
            except BaseException:
                self._rollback(conn)
                raise
            return result

        return self._busy_retry(attempt)

    @staticmethod
    def _rollback(conn: sqlite3.Connection) -> None:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the original error is the one worth reporting; SQLite rolls back on close anyway

    def mapped(self, exc: sqlite3.Error, waited: float) -> DispatchError:
        """The dispatch error a SQLite error stands for, naming the file (``waited``: seconds spent)."""
        where = str(self.path)
        name = getattr(exc, "sqlite_errorname", "") or type(exc).__name__
        if name == "SQLITE_NOTADB":
            return InvalidError("is not a SQLite database, so it is not a dispatch store", path=where)
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            # Say how long we really waited: SQLite gives up at once where waiting could deadlock.
            return UnavailableError(
                f"{where}: the store stayed locked by another connection; gave up after {waited:.2f}s "
                f"(busy_timeout {self.busy_timeout:g}s)"
            )
        if name.startswith("SQLITE_CORRUPT"):
            return UnavailableError(
                f"{where}: the database file is corrupt ({exc}); move it away or restore a backup"
            )
        if name.startswith(("SQLITE_CANTOPEN", "SQLITE_PERM", "SQLITE_READONLY", "SQLITE_AUTH")):
            return UnavailableError(f"{where}: cannot open or write the store file ({exc})")
        return UnavailableError(f"{where}: {exc} ({name})")

    async def read(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """``body`` in one read transaction, in the worker thread."""
        return await self.run(lambda conn: self._transaction(conn, body, write=False))

    async def write(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """``body`` in one write transaction (``BEGIN IMMEDIATE``), in the worker thread."""
        return await self.run(lambda conn: self._transaction(conn, body, write=True))

    async def close(self, last: Callable[[], None]) -> None:
        """Finish the calls already made, run ``last`` in the worker, close the file and stop the worker
        thread. Idempotent."""
        with self._close_lock:
            if self.closed:
                return
            self.closed = True
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._disconnect, last)
        finally:
            self._executor.shutdown(wait=False)

    def _disconnect(self, last: Callable[[], None]) -> None:
        last()
        if self._conn is not None:
            try:
                self._conn.close()
            finally:
                self._conn = None


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
