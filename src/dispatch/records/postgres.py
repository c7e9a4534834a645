"""The shared :class:`~dispatch.records.Store`: one PostgreSQL database, for supervisors on several hosts.

Design, and why:

- **psycopg 3, async, with its pool** (``pip install 'dispatch-train[postgres]'``). Reads run in autocommit
  (one round trip); every write is one transaction that first locks the record's row (a lease change:
  an ``UPDATE`` whose ``WHERE`` is the lease rule, and when it changes nothing the same functions as
  the other stores, ``_common``, say why; a record update: the ``UPDATE ... WHERE revision =
  expected`` itself), and writes the row and its history together. Under ``READ COMMITTED`` a second
  writer waits for the lock and then reads (or, in an ``UPDATE``, judges) the committed row, so compare-and-swap is exact. A record update is a single
  statement (the row and its history in one ``WITH``), so it runs in autocommit, a transaction of its
  own, in one round trip instead of three; the one a supervisor makes at every transition.
- **The database's clock.** Hosts' clocks differ; a lease judged by each supervisor's own clock would
  let two supervisors disagree about whether it expired. Every time a write stamps (``updated_at``,
  lease expiry) or judges (is this lease live? may this record be purged?) is read from the server:
  ``clock_timestamp()`` taken *when the row is locked*. (``now()`` is the start of the transaction,
  which for a writer that waited for the lock is in the past.) One clock, so no skew bound is needed.
  A ``clock`` can still be given, for tests that move time by hand; then it replaces the server's.
- **Append-only history, enforced by the database**: a trigger refuses ``UPDATE`` and ``TRUNCATE`` on
  ``dispatch_history``, and ``DELETE`` while the entry's record exists; :meth:`purge` deletes the record
  first, in the same transaction.
- **A lease is a write of three columns, not of the record.** A record's row holds its JSON document
  (``doc``) and, in columns, its ``revision``, ``created_at``, ``updated_at`` and lease; the columns are
  what the record *is* (the document's copies of those fields may be out of date: a read lays the
  columns over it). So taking, renewing or releasing a lease updates the lease columns,
  the revision and ``updated_at`` — no record encoded, no document rewritten — and a fleet member renews
  all its leases that are due in one ``UPDATE`` statement. (Schema v4; the rename of ``body`` to ``doc``
  makes a dispatch that read the document alone, written before v4, fail instead of misread the row.)
- **Versioned schema**: ``dispatch_schema`` holds one row per applied migration. Migrating takes a
  transaction-level advisory lock, re-reads the version under it, and applies each step in that one
  transaction: several processes starting together migrate exactly once, and a crash mid-migration
  leaves the old schema.
- **Change notification**: a trigger on ``dispatch_records`` sends ``NOTIFY dispatch_records, <job id>``;
  :meth:`changes` listens on a connection of its own. Notifications are sent at commit, so a listener
  never hears of a write that rolled back.
- **Key-values** (:class:`~dispatch.records.KeyValues`, schema v2): ``dispatch_kv``, one row per key,
  written by upsert; a cache, so no history, no revision and no notification.
- **The password** (from the DSN, ``PGPASSFILE``/``~/.pgpass`` or ``PGPASSWORD``, all read by libpq)
  is never shown: ``repr``/``str`` and every error name the server as ``postgresql://user@host:port/db``,
  and error texts are scrubbed of it.
"""

from __future__ import annotations

import asyncio
import builtins
import functools
import math
import select
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Literal, TypeVar

import psycopg
from psycopg import AsyncConnection, errors, pq
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

from dispatch import logs
from dispatch.clock import Clock
from dispatch.errors import (
    ConflictError,
    DispatchError,
    InvalidError,
    NotFoundError,
    OutcomeUnknownError,
    PermissionDeniedError,
    UnavailableError,
)
from dispatch.model import JobRecord, Lease, State, Transition, check_job_id
from dispatch.records._common import (
    check_cutoff,
    check_holder,
    check_revision,
    check_states,
    check_ttl,
    checked_record,
    checked_record_text,
    checked_transition,
    checked_transitions,
    decode_record,
    decode_transition,
    lease_after_acquire,
    lease_after_release,
    record_text,
)
from dispatch.records.postgres_url import check_dsn, redact_dsn
from dispatch.records.store import Changes, Listing, check_key_value, check_leasing, read_rows

__all__ = ["CHANNEL", "SCHEMA_VERSION", "PostgresStore", "redact_dsn"]

T = TypeVar("T")

SCHEMA_VERSION = 4
"""The schema version this code writes; older databases are migrated on first use, newer ones refused."""

CHANNEL = "dispatch_records"
"""The ``LISTEN/NOTIFY`` channel; the payload is the changed record's job id."""

_MIGRATION_LOCK = 0x44535043  # pg_advisory_xact_lock key ("DSPC"), held while migrating

_NOW = "coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)"
"""The time of a write: the caller's clock when one was given, else the server's, read at this point."""

_SCHEMA_V1 = (
    """CREATE TABLE dispatch_records (
        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        job_id text NOT NULL UNIQUE,
        state text NOT NULL,
        terminal boolean NOT NULL,
        created_at double precision NOT NULL,
        updated_at double precision NOT NULL,
        revision bigint NOT NULL CHECK (revision >= 1),
        lease_holder text,
        lease_expires_at double precision,
        body text NOT NULL
    )""",
    "CREATE INDEX dispatch_records_by_state ON dispatch_records (state)",
    "CREATE INDEX dispatch_records_by_age ON dispatch_records (terminal, updated_at)",
    """CREATE TABLE dispatch_history (
        job_id text NOT NULL,
        seq integer NOT NULL CHECK (seq >= 1),
        body text NOT NULL,
        PRIMARY KEY (job_id, seq)
    )""",
    # search_path is pinned so the guard always checks *our* records table.
    """CREATE FUNCTION dispatch_history_guard() RETURNS trigger LANGUAGE plpgsql
       SET search_path FROM CURRENT AS $$
       BEGIN
           IF TG_OP = 'DELETE' THEN
               IF EXISTS (SELECT 1 FROM dispatch_records WHERE job_id = OLD.job_id) THEN
                   RAISE EXCEPTION 'dispatch history is deleted only with its record (purge)'
                       USING ERRCODE = 'integrity_constraint_violation';
               END IF;
               RETURN OLD;
           END IF;
           RAISE EXCEPTION 'dispatch history is append-only (% refused)', TG_OP
               USING ERRCODE = 'integrity_constraint_violation';
       END $$""",
    """CREATE TRIGGER dispatch_history_append_only BEFORE UPDATE OR DELETE ON dispatch_history
       FOR EACH ROW EXECUTE FUNCTION dispatch_history_guard()""",
    """CREATE TRIGGER dispatch_history_no_truncate BEFORE TRUNCATE ON dispatch_history
       FOR EACH STATEMENT EXECUTE FUNCTION dispatch_history_guard()""",
    f"""CREATE FUNCTION dispatch_records_notify() RETURNS trigger LANGUAGE plpgsql AS $$
       BEGIN
           PERFORM pg_notify('{CHANNEL}', CASE WHEN TG_OP = 'DELETE' THEN OLD.job_id ELSE NEW.job_id END);
           RETURN NULL;
       END $$""",
    """CREATE TRIGGER dispatch_records_changed AFTER INSERT OR UPDATE OR DELETE ON dispatch_records
       FOR EACH ROW EXECUTE FUNCTION dispatch_records_notify()""",
)

_SCHEMA_V2 = (
    # v2: a small key-value table beside the records (KeyValues): host caches such as probe findings.
    # No trigger: its writes are not record changes, so they are not NOTIFYed.
    "CREATE TABLE dispatch_kv (key text PRIMARY KEY, value text NOT NULL)",
)

_SCHEMA_V3 = (
    # v3: a fleet of supervisors (Leasing): its members, and records found by lease holder and expiry.
    """CREATE TABLE dispatch_members (
        grp text NOT NULL,
        holder text NOT NULL,
        expires_at double precision NOT NULL,
        PRIMARY KEY (grp, holder)
    )""",
    "CREATE INDEX dispatch_records_by_holder ON dispatch_records (lease_holder)",
    "CREATE INDEX dispatch_records_by_lease ON dispatch_records (lease_expires_at)",
)

_SCHEMA_V4 = (
    # v4: the columns revision, created_at, updated_at, lease_holder and lease_expires_at are the record's
    # (a lease change writes them alone); the JSON document's copies of those fields may be older. The
    # column is renamed so that a dispatch from before v4 still running against the database (it checks
    # the version only when it connects) fails every call instead of reading a lease or revision that is
    # out of date from the document.
    "ALTER TABLE dispatch_records RENAME COLUMN body TO doc",
)

_ROW = "doc, revision, created_at, updated_at, lease_holder, lease_expires_at"
"""The columns a record is read from: its document, then the columns that override the document's."""

_ACQUIRE = f"""UPDATE dispatch_records
    SET lease_holder = %(holder)s, lease_expires_at = {_NOW} + %(ttl)s, revision = revision + 1,
        updated_at = {_NOW}
    WHERE job_id = %(job_id)s
      AND (lease_holder IS NULL OR lease_holder = %(holder)s OR lease_expires_at <= {_NOW})
    RETURNING {_ROW}"""
"""A lease taken or renewed (:func:`~dispatch.records._common.lease_after_acquire`'s rule, in the
statement): the lease columns, revision and ``updated_at``; the document stays as it is."""

_RELEASE = f"""UPDATE dispatch_records
    SET lease_holder = NULL, lease_expires_at = NULL, revision = revision + 1, updated_at = {_NOW}
    WHERE job_id = %(job_id)s AND lease_holder = %(holder)s
    RETURNING {_ROW}"""
"""A lease given up by its holder (:func:`~dispatch.records._common.lease_after_release`)."""


@functools.cache
def _update_statement(transitions: int) -> str:
    """The one statement of :meth:`PostgresStore.update` appending ``transitions`` history entries.

    The compare-and-swap is the ``UPDATE`` itself: it locks the row, and a writer that waited for the
    lock judges the committed row, so it finds the revision moved. The document is the caller's record
    as checked; its revision, times and lease are the columns', which the write moves (``revision``,
    ``updated_at``, the time read once the row is locked) or keeps (``created_at``, the lease). The
    history rows (parameters ``h0``, ``h1``, ...) are inserted only if the row was updated, numbered after
    the last entry in the statement's snapshot: every entry was committed by a writer that moved the
    revision, and the revision the caller expects was read after that writer committed, so the
    snapshot holds them all (a caller that guessed a revision can at worst collide on the primary key:
    ``ConflictError``, nothing written)."""
    update = f"""UPDATE dispatch_records SET state = %(state)s, terminal = %(terminal)s, doc = %(doc)s,
            revision = revision + 1, updated_at = {_NOW}
        WHERE job_id = %(job_id)s AND revision = %(expected)s
        RETURNING {_ROW}"""
    if not transitions:
        return update
    rows = ", ".join(f"({i + 1}, %(h{i})s::text)" for i in range(transitions))
    return f"""WITH updated AS ({update}),
        added AS (INSERT INTO dispatch_history (job_id, seq, body)
            SELECT %(job_id)s, base.n + t.ord, t.body
            FROM (SELECT count(*) AS c FROM updated) AS u,
                 (SELECT coalesce(max(seq), 0) AS n FROM dispatch_history WHERE job_id = %(job_id)s) AS base,
                 (VALUES {rows}) AS t(ord, body)
            WHERE u.c = 1)
        SELECT * FROM updated"""


_MIGRATIONS: dict[int, tuple[str, ...]] = {0: _SCHEMA_V1, 1: _SCHEMA_V2, 2: _SCHEMA_V3, 3: _SCHEMA_V4}
"""The migration hook: ``_MIGRATIONS[v]`` upgrades a database from schema ``v`` to ``v + 1``. All steps
run in one transaction, under the advisory lock, with the row recording the new version."""


def _quiet(conn: AsyncConnection[tuple[Any, ...]]) -> bool:
    """Whether a pooled connection is open, idle, and has nothing from the server waiting to be read.
    On an idle connection the server speaks only to end it (a ``FATAL`` message, then the socket
    closes: a restart, ``pg_terminate_backend``, an idle timeout) or for what dispatch never asks of a
    pooled connection (``LISTEN``); so a readable socket means a connection not to send a write on.
    One poll of the socket, no round trip."""
    if conn.closed or conn.info.transaction_status != pq.TransactionStatus.IDLE:
        return False
    readable, _, _ = select.select([conn.fileno()], [], [], 0)
    return not readable


class PostgresStore:
    """Job records in a PostgreSQL database, shared by supervisors and CLIs on any number of hosts.

    ``dsn`` is a libpq connection string, ``postgresql://user[:password]@host[:port]/dbname[?opts]`` or
    ``key=value`` pairs; a password left out comes from ``PGPASSFILE``/``~/.pgpass`` or ``PGPASSWORD``.
    ``max_size`` bounds the pool's connections; ``timeout`` bounds how long a call waits for one (and
    for connecting) before ``UnavailableError``. ``clock`` replaces the database's clock (tests only:
    supervisors on different hosts must share the server's clock, which is the default).

    Nothing connects until the first call, which also creates or migrates the schema. The role needs
    to create tables in the database the first time (afterwards: SELECT/INSERT/UPDATE/DELETE).
    Errors: the server unreachable, a closed store or a lost connection are ``UnavailableError``; bad
    credentials or missing privileges ``PermissionDeniedError``; a connection lost while a write was
    committing ``OutcomeUnknownError`` (read the record again); a database written by a newer dispatch,
    or holding a foreign ``dispatch_records`` table, ``InvalidError``.
    """

    def __init__(
        self,
        dsn: str,
        *,
        clock: Clock | None = None,
        max_size: int = 8,
        timeout: float = 30.0,
        application_name: str = "dispatch",
    ) -> None:
        if not isinstance(dsn, str) or not dsn.strip():
            raise InvalidError(
                f"expected a PostgreSQL connection string (postgresql://user@host/dbname), got "
                f"{type(dsn).__name__ if not isinstance(dsn, str) else repr(dsn)}",
                path="dsn",
            )
        try:
            params = conninfo_to_dict(dsn)
        except psycopg.Error:
            # libpq's message may quote the string, password included: say only what is wrong.
            raise InvalidError(
                "not a valid PostgreSQL connection string; expected postgresql://user@host:port/dbname "
                "or key=value pairs",
                path="dsn",
            ) from None
        if "://" in dsn:
            check_dsn(dsn, "dsn")  # libpq would accept a bad port here and fail only when connecting
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise InvalidError(
                f"expected a positive number of connections, got {max_size!r}", path="max_size"
            )
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise InvalidError(f"expected a positive number of seconds, got {timeout!r}", path="timeout")
        self.__dsn = dsn  # name-mangled, and never formatted anywhere
        self.__password = str(params.get("password") or "")
        self._where = redact_dsn(dsn)
        self._clock = clock
        self._timeout = float(timeout)
        self._max_size = max_size
        self._kwargs: dict[str, Any] = {"autocommit": True}
        if "application_name" not in params:
            self._kwargs["application_name"] = application_name
        if "connect_timeout" not in params:
            self._kwargs["connect_timeout"] = max(2, math.ceil(self._timeout))
        self._pool: AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]] | None = None
        self._open_lock = asyncio.Lock()
        self._closed = False
        # Decoded documents by job id with the exact stored text they came from (see SqliteStore):
        # used only when the row still holds that text, so never stale; the row's columns are laid over.
        self._decoded: dict[str, tuple[str, JobRecord]] = {}

    def __repr__(self) -> str:
        return f"PostgresStore({self._where!r}{', closed' if self._closed else ''})"

    def __str__(self) -> str:
        return self._where

    @property
    def where(self) -> str:
        """The database, as ``postgresql://user@host:port/dbname`` (no password)."""
        return self._where

    # ---- errors: the one place psycopg's exceptions become dispatch's ------------------------------

    def _scrub(self, text: str) -> str:
        if self.__password:
            text = text.replace(self.__password, logs.MARK)
        return text

    def _mapped(self, exc: BaseException, *, committing: bool = False) -> DispatchError:
        """The dispatch error for a psycopg (or pool) failure, naming the database, never the password."""
        detail = self._scrub(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        where = self._where
        if isinstance(exc, errors.UniqueViolation):
            return ConflictError(f"{where}: {detail}")
        if isinstance(exc, errors.SerializationFailure | errors.DeadlockDetected | errors.LockNotAvailable):
            return ConflictError(f"{where}: a concurrent write got in the way ({detail}); read and retry")
        if isinstance(exc, errors.InsufficientPrivilege | errors.InvalidAuthorizationSpecification):
            return PermissionDeniedError(f"{where}: {detail}")
        sqlstate = getattr(exc, "sqlstate", None) or ""
        if sqlstate.startswith("28") or "authentication failed" in detail or "no password supplied" in detail:
            return PermissionDeniedError(f"{where}: cannot log in: {detail}")
        if isinstance(exc, errors.UndefinedTable):
            return InvalidError(
                f"the database's dispatch tables are missing or altered ({detail})", path=where
            )
        if committing and isinstance(exc, psycopg.OperationalError):
            return OutcomeUnknownError(
                f"{where}: the connection was lost while a write was committing ({detail}); "
                "it may or may not have been applied: read the record again"
            )
        if isinstance(exc, psycopg.errors.IntegrityError):
            return InvalidError(f"the database refused the write: {detail}", path=where)
        return UnavailableError(f"{where}: {detail}")

    # ---- connecting and migrating ------------------------------------------------------------------

    async def _connect(self) -> AsyncConnection[tuple[Any, ...]]:
        try:
            return await asyncio.wait_for(
                AsyncConnection.connect(self.__dsn, **self._kwargs), self._timeout + 1
            )
        except TimeoutError:
            raise UnavailableError(f"{self._where}: no connection within {self._timeout:g}s") from None
        except psycopg.Error as exc:
            raise self._mapped(exc) from None

    async def _ready(self) -> AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]]:
        if self._closed:
            raise UnavailableError(f"{self._where}: the store is closed")
        if self._pool is not None:
            return self._pool
        async with self._open_lock:
            if self._pool is None:
                # One direct connection first: a wrong password or an unreachable server fails now,
                # with libpq's reason, instead of as a pool timeout later.
                conn = await self._connect()
                try:
                    await self._migrate(conn)
                except psycopg.Error as exc:
                    raise self._mapped(exc) from None
                finally:
                    await conn.close()
                pool: AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]] = AsyncConnectionPool(
                    self.__dsn,
                    kwargs=self._kwargs,
                    min_size=1,
                    max_size=self._max_size,
                    timeout=self._timeout,
                    name="dispatch-records",
                    open=False,
                )
                await pool.open(wait=False)
                if self._closed:  # closed while we were opening
                    await pool.close()
                    raise UnavailableError(f"{self._where}: the store is closed")
                self._pool = pool
        return self._pool

    async def _migrate(self, conn: AsyncConnection[tuple[Any, ...]]) -> None:
        if await self._version(conn) == SCHEMA_VERSION:
            return  # the common case, without taking the lock
        async with conn.transaction():
            # Every dispatch process takes this lock to migrate: the second waits, then finds the
            # schema current. The lock ends with the transaction, so a crash cannot leave it held.
            await conn.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK,))
            await conn.execute(
                """CREATE TABLE IF NOT EXISTS dispatch_schema (
                       version integer PRIMARY KEY,
                       applied_at timestamptz NOT NULL DEFAULT now()
                   )"""
            )
            version = await self._version(conn)
            if version == 0 and await self._exists(conn, "dispatch_records"):
                raise InvalidError(
                    "has a table dispatch_records that is not a dispatch store's (no dispatch_schema "
                    "version); use another database or schema",
                    path=self._where,
                )
            while version < SCHEMA_VERSION:
                for statement in _MIGRATIONS[version]:
                    await conn.execute(statement.encode())
                version += 1
                await conn.execute("INSERT INTO dispatch_schema (version) VALUES (%s)", (version,))

    async def _version(self, conn: AsyncConnection[tuple[Any, ...]]) -> int:
        if not await self._exists(conn, "dispatch_schema"):
            return 0
        row = await (await conn.execute("SELECT coalesce(max(version), 0) FROM dispatch_schema")).fetchone()
        version = int(row[0]) if row else 0
        if version > SCHEMA_VERSION:
            raise InvalidError(
                f"was written by a newer dispatch (schema version {version}; this one knows up to "
                f"{SCHEMA_VERSION}); upgrade dispatch to use it",
                path=self._where,
            )
        return version

    @staticmethod
    async def _exists(conn: AsyncConnection[tuple[Any, ...]], table: str) -> bool:
        row = await (await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,))).fetchone()
        return bool(row and row[0])

    # ---- running calls -----------------------------------------------------------------------------

    async def _read(self, body: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[T]]) -> T:
        """Run ``body`` on a pooled connection in autocommit: each statement sees committed data."""
        return await self._call(body, "read")

    async def _write(self, body: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[T]]) -> T:
        """Run ``body`` in one transaction: applied whole or not at all. A cancelled call is settled
        (committed or rolled back) before the cancellation propagates; psycopg waits for the server."""
        return await self._call(body, "transaction")

    async def _statement(self, body: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[T]]) -> T:
        """Run ``body``, whose first statement is the whole write, in autocommit: that statement is a
        transaction of its own, so the write costs one round trip instead of three (``BEGIN``, it,
        ``COMMIT``). Once it is sent it may have been applied, so a connection lost from then on is
        ``OutcomeUnknownError``; a pooled connection the server ended meanwhile is found before (see
        :func:`_quiet`) and another one taken."""
        return await self._call(body, "statement")

    async def _call(
        self,
        body: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[T]],
        how: Literal["read", "transaction", "statement"],
    ) -> T:
        pool = await self._ready()
        # A pooled connection the server dropped (restart, idle timeout, pg_terminate_backend) is
        # found dead only when used. Until COMMIT was sent nothing can have been applied, so the call
        # runs again on another connection (at most once per pooled one); a drop during COMMIT is
        # reported as OutcomeUnknownError, never retried.
        for attempt in range(self._max_size + 1):
            stage = "start"
            used: AsyncConnection[tuple[Any, ...]] | None = None
            try:
                async with pool.connection() as conn:
                    used = conn
                    if how == "read":
                        return await body(conn)
                    if how == "statement":
                        if not _quiet(conn) and attempt < self._max_size:
                            await conn.close()  # the pool drops a closed connection
                            continue  # (on the last attempt it is sent: its error is reported)
                        stage = "commit"  # the statement commits itself
                        return await body(conn)
                    async with conn.transaction():
                        result = await body(conn)
                        stage = "commit"  # leaving the block sends COMMIT
                    return result
            except DispatchError:
                raise
            except psycopg.Error as exc:
                lost = used is not None and used.closed
                if lost and stage != "commit" and attempt < self._max_size:
                    continue
                raise self._mapped(exc, committing=stage == "commit") from None
        raise AssertionError("unreachable")  # pragma: no cover

    def _now(self) -> float | None:
        return self._clock.now() if self._clock is not None else None

    async def _current(self, conn: AsyncConnection[tuple[Any, ...]], job_id: str) -> tuple[JobRecord, float]:
        """The record as committed now, and the time it was read at."""
        cur = await conn.execute(
            f"SELECT {_ROW}, {_NOW} FROM dispatch_records WHERE job_id = %(job_id)s",
            {"job_id": job_id, "now": self._now()},
        )
        row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"no record for job {job_id!r}")
        return self._decode(job_id, row), float(row[6])

    async def _time(self, conn: AsyncConnection[tuple[Any, ...]]) -> float:
        if self._clock is not None:
            return self._clock.now()
        row = await (await conn.execute(f"SELECT {_NOW}", {"now": None})).fetchone()
        assert row is not None
        return float(row[0])

    # ---- rows --------------------------------------------------------------------------------------

    def _decode(self, job_id: str, row: Sequence[Any]) -> JobRecord:
        """The record of a row read as ``_ROW``: its document, with the row's revision, times and lease."""
        text, revision, created_at, updated_at, holder, expires_at = row[:6]
        hit = self._decoded.get(job_id)
        if hit is not None and hit[0] == text:
            doc = hit[1]
        else:
            doc = decode_record(job_id, text, self._where)
            self._remember(text, doc)
        lease = doc.lease
        if holder is None:
            lease = None
        elif lease is None or lease.holder != holder or lease.expires_at != expires_at:
            if not isinstance(expires_at, float):
                raise InvalidError(
                    f"the stored record of job {job_id!r} in {self._where} has a lease holder without an expiry"
                )
            lease = Lease(holder, expires_at)
        if (
            doc.revision == revision
            and doc.updated_at == updated_at
            and doc.created_at == created_at
            and lease is doc.lease
        ):
            return doc
        return doc.replace(revision=revision, created_at=created_at, updated_at=updated_at, lease=lease)

    def _rows(self, rows: Iterable[Sequence[Any]]) -> Listing:
        """The records of rows read as ``job_id, _ROW``; one that does not decode is set aside."""
        return read_rows(((str(row[0]), row[1:]) for row in rows), self._decode)

    def _remember(self, text: str, record: JobRecord) -> None:
        self._decoded[record.job_id] = (text, record)

    def _columns(self, record: JobRecord) -> dict[str, Any]:
        lease = record.lease
        text = record_text(record)
        self._remember(text, record)  # harmless if the transaction rolls back: keyed by text
        return {
            "job_id": record.job_id,
            "state": record.outcome.state.value,
            "terminal": record.outcome.state.terminal,
            "created_at": record.created_at,
            "updated_at": record.updated_at,
            "revision": record.revision,
            "lease_holder": lease.holder if lease is not None else None,
            "lease_expires_at": lease.expires_at if lease is not None else None,
            "doc": text,
        }

    # ---- the Store protocol ------------------------------------------------------------------------

    async def create(self, record: JobRecord, transition: Transition) -> JobRecord:
        """Insert a new record (stored with revision 1) and its first transition.
        ``ConflictError`` if the job id is taken."""
        checked = checked_record(record)
        _, first = checked_transition(checked.job_id, transition, "transition")

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> JobRecord:
            stored = checked.replace(revision=1, updated_at=await self._time(conn))
            cur = await conn.execute(
                """INSERT INTO dispatch_records (job_id, state, terminal, created_at, updated_at, revision,
                       lease_holder, lease_expires_at, doc)
                   VALUES (%(job_id)s, %(state)s, %(terminal)s, %(created_at)s, %(updated_at)s,
                       %(revision)s, %(lease_holder)s, %(lease_expires_at)s, %(doc)s)
                   ON CONFLICT (job_id) DO NOTHING""",
                self._columns(stored),
            )
            if cur.rowcount != 1:
                raise ConflictError(f"a record for job {checked.job_id!r} already exists")
            await conn.execute(
                "INSERT INTO dispatch_history (job_id, seq, body) VALUES (%s, 1, %s)", (stored.job_id, first)
            )
            return stored

        return await self._write(body)

    async def get(self, job_id: str) -> JobRecord:
        """The current record. ``NotFoundError`` if there is none."""
        check_job_id(job_id)

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> JobRecord:
            cur = await conn.execute(f"SELECT {_ROW} FROM dispatch_records WHERE job_id = %s", (job_id,))
            row = await cur.fetchone()
            if row is None:
                raise NotFoundError(f"no record for job {job_id!r}")
            return self._decode(job_id, row)

        return await self._read(body)

    async def list(self, *, states: Iterable[State] | None = None) -> Listing:
        """Every record (optionally only those in ``states``), oldest first; unreadable ones aside."""
        wanted = check_states(states)

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> Listing:
            if wanted is None:
                cur = await conn.execute(f"SELECT job_id, {_ROW} FROM dispatch_records ORDER BY seq")
            else:
                cur = await conn.execute(
                    f"SELECT job_id, {_ROW} FROM dispatch_records WHERE state = ANY(%s) ORDER BY seq",
                    (sorted(s.value for s in wanted),),
                )
            return self._rows(await cur.fetchall())

        return await self._read(body)

    async def update(
        self, record: JobRecord, *, expected_revision: int, transitions: Sequence[Transition] = ()
    ) -> JobRecord:
        """Replace the record if its stored revision is ``expected_revision``, appending ``transitions``
        atomically with it. ``ConflictError`` if the revision moved, ``NotFoundError`` if it is gone.

        The stored ``created_at`` and lease are kept: the lease changes only through
        :meth:`acquire_lease` and :meth:`release_lease`."""
        checked, text = checked_record_text(record)
        added = checked_transitions(checked.job_id, transitions)
        check_revision(expected_revision)
        job_id = checked.job_id

        params: dict[str, Any] = {
            "job_id": job_id,
            "state": checked.outcome.state.value,
            "terminal": checked.outcome.state.terminal,
            "doc": text,
            "expected": expected_revision,
            "now": self._now(),
        }
        params.update((f"h{i}", t) for i, (_, t) in enumerate(added))

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> JobRecord:
            cur = await conn.execute(_update_statement(len(added)), params)
            row = await cur.fetchone()
            if row is None:
                found = await (
                    await conn.execute("SELECT revision FROM dispatch_records WHERE job_id = %s", (job_id,))
                ).fetchone()
                if found is None:
                    raise NotFoundError(f"no record for job {job_id!r}")
                raise ConflictError(
                    f"job {job_id!r} is at revision {found[0]}, not {expected_revision}: "
                    "it changed since it was read"
                )
            self._remember(text, checked)  # harmless if the transaction rolls back: keyed by text
            return self._decode(job_id, row)

        return await self._statement(body)

    async def history(self, job_id: str) -> builtins.list[Transition]:
        """The record's transitions, oldest first. ``NotFoundError`` if there is no record."""
        check_job_id(job_id)

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> builtins.list[Transition]:
            # One statement, one snapshot: the record and its history as of the same moment.
            cur = await conn.execute(
                """SELECT h.seq, h.body FROM dispatch_records r
                   LEFT JOIN dispatch_history h ON h.job_id = r.job_id
                   WHERE r.job_id = %s ORDER BY h.seq""",
                (job_id,),
            )
            rows = await cur.fetchall()
            if not rows:
                raise NotFoundError(f"no record for job {job_id!r}")
            return [
                decode_transition(job_id, seq, text, self._where) for seq, text in rows if seq is not None
            ]

        return await self._read(body)

    async def acquire_lease(self, job_id: str, holder: str, ttl: float) -> JobRecord:
        """Take or renew the lease on a record for ``ttl`` seconds, by the database's clock. Succeeds
        when there is no lease, it has expired, or ``holder`` already holds it; otherwise
        ``ConflictError`` naming the holder."""
        check_job_id(job_id)
        check_holder(holder)
        seconds = check_ttl(ttl)

        def refused(current: JobRecord, now: float) -> JobRecord | None:
            lease_after_acquire(job_id, current.lease, holder, seconds, now)  # names the holder
            return None  # it lapsed in between: asked for again

        # Run again after a lost connection, it takes the same lease (the holder's own is renewed).
        return await self._lease_change(_ACQUIRE, job_id, {"holder": holder, "ttl": seconds}, refused)

    async def release_lease(self, job_id: str, holder: str) -> JobRecord:
        """Give up a lease held by ``holder``. ``ConflictError`` if another holder has it now.
        Releasing when nobody holds a live lease changes nothing (and does not bump the revision)."""
        check_job_id(job_id)
        check_holder(holder)

        def refused(current: JobRecord, now: float) -> JobRecord | None:
            changed, _ = lease_after_release(job_id, current.lease, holder, now)  # or ConflictError
            return None if changed else current  # nothing to give up: the record as it is

        # Run again after a lost connection, it finds the lease already given up: nothing to do.
        return await self._lease_change(_RELEASE, job_id, {"holder": holder}, refused)

    async def _lease_change(
        self,
        statement: str,
        job_id: str,
        params: dict[str, Any],
        refused: Callable[[JobRecord, float], JobRecord | None],
    ) -> JobRecord:
        """Run a lease change, one statement with the lease rule in its ``WHERE`` (atomic on its own,
        the time read once the row is locked, as renew_leases does), in autocommit. When it changes no
        row, the record as committed now goes to ``refused``, the shared rule of ``_common``: it raises
        why (``ConflictError`` naming the holder), returns the record (nothing to change), or ``None``
        (the lease moved in between: the statement runs again)."""

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> JobRecord:
            while True:
                args = {**params, "job_id": job_id, "now": self._now()}
                row = await (await conn.execute(statement, args)).fetchone()
                if row is not None:
                    return self._decode(job_id, row)
                current, now = await self._current(conn, job_id)
                result = refused(current, now)
                if result is not None:
                    return result

        # Having the same effect when run again, a lease change is retried like a read.
        return await self._read(body)

    async def purge(self, older_than: float) -> int:
        """Delete terminal records (and their history) last updated before ``older_than`` (epoch
        seconds). Returns how many were deleted. Non-terminal records are never purged, nor records
        under a live lease (judged by the database's clock)."""
        cutoff = check_cutoff(older_than)

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> int:
            # One statement decides and deletes; a row written meanwhile is re-checked after its lock.
            cur = await conn.execute(
                f"""DELETE FROM dispatch_records
                    WHERE terminal AND updated_at < %(cutoff)s
                      AND (lease_expires_at IS NULL OR lease_expires_at <= {_NOW})
                    RETURNING job_id""",
                {"cutoff": cutoff, "now": self._now()},
            )
            doomed = [job_id for (job_id,) in await cur.fetchall()]
            # Records first: the history trigger allows deleting history only once its record is gone.
            if doomed:
                await conn.execute("DELETE FROM dispatch_history WHERE job_id = ANY(%s)", (doomed,))
            for job_id in doomed:
                self._decoded.pop(job_id, None)
            return len(doomed)

        return await self._write(body)

    async def heartbeat(self, group: str, holder: str, ttl: float) -> builtins.list[str]:
        """Mark ``holder`` a live member of ``group`` for ``ttl`` seconds, by the database's clock; the
        live members, sorted (see :class:`~dispatch.records.store.Leasing`)."""
        check_leasing(group, holder)
        seconds = check_ttl(ttl)

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> builtins.list[str]:
            now = await self._time(conn)
            await conn.execute(
                """INSERT INTO dispatch_members (grp, holder, expires_at) VALUES (%s, %s, %s)
                   ON CONFLICT (grp, holder) DO UPDATE SET expires_at = EXCLUDED.expires_at""",
                (group, holder, now + seconds),
            )
            await conn.execute("DELETE FROM dispatch_members WHERE expires_at <= %s", (now,))
            cur = await conn.execute(
                "SELECT holder FROM dispatch_members WHERE grp = %s ORDER BY holder", (group,)
            )
            return [str(r[0]) for r in await cur.fetchall()]

        return await self._write(body)

    async def leasable(self, holder: str, *, states: Iterable[State], limit: int, after: str = "") -> Listing:
        """The records ``holder`` leases, then a page of at most ``limit`` claimable ones in ``states``
        after ``after``, by job id; expiry judged by the database's clock (see
        :class:`~dispatch.records.store.Leasing`)."""
        check_leasing("-", holder, limit)
        wanted = sorted(s.value for s in check_states(states) or ())

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> Listing:
            held = await conn.execute(
                f"SELECT job_id, {_ROW} FROM dispatch_records WHERE lease_holder = %s ORDER BY job_id",
                (holder,),
            )
            rows = await held.fetchall()
            free = await conn.execute(
                f"""SELECT job_id, {_ROW} FROM dispatch_records
                    WHERE state = ANY(%(states)s) AND job_id > %(after)s
                      AND lease_holder IS DISTINCT FROM %(holder)s
                      AND (lease_holder IS NULL OR lease_expires_at <= {_NOW})
                    ORDER BY job_id LIMIT %(limit)s""",
                {"states": wanted, "after": str(after), "holder": holder, "limit": limit, "now": self._now()},
            )
            return self._rows([*rows, *await free.fetchall()])

        return await self._read(body)

    async def renew_leases(self, holder: str, ttl: float, job_ids: Iterable[str]) -> builtins.list[JobRecord]:
        """Renew ``holder``'s leases on ``job_ids`` in one transaction, by the database's clock; the
        records renewed."""
        check_holder(holder)
        seconds = check_ttl(ttl)
        ids = sorted({check_job_id(j) for j in job_ids})  # locked in one order: no deadlock between renewals

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> builtins.list[JobRecord]:
            # One statement (atomic on its own): the rows still ours are locked in job id order (no
            # deadlock between renewals), then their lease columns written; no document is rewritten.
            # The time is read per row, once it is locked.
            cur = await conn.execute(
                f"""UPDATE dispatch_records
                    SET lease_expires_at = {_NOW} + %(ttl)s, revision = revision + 1, updated_at = {_NOW}
                    WHERE job_id IN (SELECT job_id FROM dispatch_records
                                     WHERE job_id = ANY(%(ids)s) AND lease_holder = %(holder)s
                                     ORDER BY job_id FOR UPDATE)
                      AND lease_holder = %(holder)s
                    RETURNING job_id, {_ROW}""",
                {"ids": ids, "holder": holder, "ttl": seconds, "now": self._now()},
            )
            rows = sorted(await cur.fetchall(), key=lambda row: str(row[0]))
            return [self._decode(str(row[0]), row[1:]) for row in rows]

        # Autocommit: one statement is one transaction. Run again after a lost connection, it renews
        # the same leases (a lease is renewed from the time it is written), so it is a read's retry.
        return await self._read(body)

    async def get_value(self, key: str) -> str | None:
        """The value kept under ``key`` (see :class:`~dispatch.records.KeyValues`), or ``None``."""
        check_key_value(key, None)

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> str | None:
            cur = await conn.execute("SELECT value FROM dispatch_kv WHERE key = %s", (key,))
            row = await cur.fetchone()
            return None if row is None else str(row[0])

        return await self._read(body)

    async def put_value(self, key: str, value: str | None) -> None:
        """Keep ``value`` under ``key``, replacing what was there; ``None`` removes it."""
        check_key_value(key, value)

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> None:
            if value is None:
                await conn.execute("DELETE FROM dispatch_kv WHERE key = %s", (key,))
            else:
                await conn.execute(
                    """INSERT INTO dispatch_kv (key, value) VALUES (%s, %s)
                       ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value""",
                    (key, value),
                )

        await self._write(body)

    async def add_value(self, key: str, value: str) -> str:
        """Keep ``value`` under ``key`` unless a value is there already; return the value kept."""
        check_key_value(key, value)

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> str:
            await conn.execute(
                "INSERT INTO dispatch_kv (key, value) VALUES (%s, %s) ON CONFLICT (key) DO NOTHING",
                (key, value),
            )
            cur = await conn.execute("SELECT value FROM dispatch_kv WHERE key = %s", (key,))
            row = await cur.fetchone()
            assert row is not None  # inserted or already there, in this transaction
            return str(row[0])

        return await self._write(body)

    def changes(self) -> Changes:
        """Subscribe to every write to the database, by any process on any host, through
        ``LISTEN dispatch_records`` on a connection of the feed's own (see
        :class:`~dispatch.records.Changes`)."""
        return _PostgresChanges(self)

    async def close(self) -> None:
        """Close the pool's connections (waiting for calls in flight). Idempotent."""
        if self._closed:
            return
        self._closed = True
        async with self._open_lock:
            pool, self._pool = self._pool, None
        self._decoded.clear()
        if pool is not None:
            await pool.close()


class _PostgresChanges(Changes):
    """``LISTEN dispatch_records`` on a dedicated autocommit connection."""

    _WAKE = 0.25
    """How often a waiting feed looks whether its store was closed (notifications wake it at once)."""

    def __init__(self, store: PostgresStore) -> None:
        self._store = store
        self._conn: AsyncConnection[tuple[Any, ...]] | None = None
        self._pending: deque[str] = deque()

    async def _start(self) -> None:
        await self._store._ready()  # the schema (and its trigger) exists before we listen
        conn = await self._store._connect()
        try:
            await conn.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as exc:
            await conn.close()
            raise self._store._mapped(exc) from None
        self._conn = conn

    async def _next(self) -> str:
        while not self._pending:
            if self._store._closed:
                raise UnavailableError(f"{self._store.where}: the store is closed; its change feed ended")
            if self._conn is None:
                raise UnavailableError(f"{self._store.where}: the change feed is closed")
            # Bounded waits, so a closed store is noticed; nothing is lost between them (unread
            # notifications wait in the socket, or in psycopg's backlog).
            try:
                async for notify in self._conn.notifies(timeout=self._WAKE, stop_after=1):
                    self._pending.append(str(notify.payload))
            except psycopg.Error as exc:
                raise self._store._mapped(exc) from None
        return self._pending.popleft()

    async def _stop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()
