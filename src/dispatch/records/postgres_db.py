"""The database under a :class:`~dispatch.records.PostgresStore`: :class:`PostgresDatabase`.

Connecting (the connection string checked, the password kept out of every text), creating or migrating
the schema once per process, the pool, running a call as a read, a transaction or one self-committing
statement (a connection the server dropped is replaced while nothing can have been applied), and
psycopg's errors mapped to dispatch's, naming the server without the password. Why it is done this way:
the store's module docstring.
"""

from __future__ import annotations

import asyncio
import math
import select
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

import psycopg
from psycopg import AsyncConnection, errors, pq
from psycopg.conninfo import conninfo_to_dict
from psycopg_pool import AsyncConnectionPool

from dispatch import logs
from dispatch.errors import (
    ConflictError,
    DispatchError,
    InvalidError,
    OutcomeUnknownError,
    PermissionDeniedError,
    UnavailableError,
)
from dispatch.records.postgres_url import check_dsn, redact_dsn

__all__ = ["CHANNEL", "NOW", "SCHEMA_VERSION", "PostgresDatabase"]

T = TypeVar("T")

NOW = "coalesce(%(now)s::float8, extract(epoch FROM clock_timestamp())::float8)"
"""The time of a write, in a statement: the caller's clock when one was given (parameter ``now``), else
the server's, read at this point (once the row is locked)."""

SCHEMA_VERSION = 4
"""The schema version this code writes; older databases are migrated on first use, newer ones refused."""

CHANNEL = "dispatch_records"
"""The ``LISTEN/NOTIFY`` channel; the payload is the changed record's job id."""

_MIGRATION_LOCK = 0x44535043  # pg_advisory_xact_lock key ("DSPC"), held while migrating

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


class PostgresDatabase:
    """One PostgreSQL database reached through a pool (see the module docstring); the arguments are
    :class:`~dispatch.records.PostgresStore`'s. Nothing connects until the first call."""

    def __init__(self, dsn: str, *, max_size: int, timeout: float, application_name: str) -> None:
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
        self.where = redact_dsn(dsn)
        self._timeout = float(timeout)
        self._max_size = max_size
        self._kwargs: dict[str, Any] = {"autocommit": True}
        if "application_name" not in params:
            self._kwargs["application_name"] = application_name
        if "connect_timeout" not in params:
            self._kwargs["connect_timeout"] = max(2, math.ceil(self._timeout))
        self._pool: AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]] | None = None
        self._open_lock = asyncio.Lock()
        self.closed = False

    # ---- errors: the one place psycopg's exceptions become dispatch's ------------------------------

    def scrub(self, text: str) -> str:
        if self.__password:
            text = text.replace(self.__password, logs.MARK)
        return text

    def mapped(self, exc: BaseException, *, committing: bool = False) -> DispatchError:
        """The dispatch error for a psycopg (or pool) failure, naming the database, never the password."""
        detail = self.scrub(str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__)
        where = self.where
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

    async def connect(self) -> AsyncConnection[tuple[Any, ...]]:
        try:
            return await asyncio.wait_for(
                AsyncConnection.connect(self.__dsn, **self._kwargs), self._timeout + 1
            )
        except TimeoutError:
            raise UnavailableError(f"{self.where}: no connection within {self._timeout:g}s") from None
        except psycopg.Error as exc:
            raise self.mapped(exc) from None

    async def ready(self) -> AsyncConnectionPool[AsyncConnection[tuple[Any, ...]]]:
        if self.closed:
            raise UnavailableError(f"{self.where}: the store is closed")
        if self._pool is not None:
            return self._pool
        async with self._open_lock:
            if self._pool is None:
                # One direct connection first: a wrong password or an unreachable server fails now,
                # with libpq's reason, instead of as a pool timeout later.
                conn = await self.connect()
                try:
                    await self._migrate(conn)
                except psycopg.Error as exc:
                    raise self.mapped(exc) from None
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
                if self.closed:  # closed while we were opening
                    await pool.close()
                    raise UnavailableError(f"{self.where}: the store is closed")
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
                    path=self.where,
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
                path=self.where,
            )
        return version

    @staticmethod
    async def _exists(conn: AsyncConnection[tuple[Any, ...]], table: str) -> bool:
        row = await (await conn.execute("SELECT to_regclass(%s) IS NOT NULL", (table,))).fetchone()
        return bool(row and row[0])

    # ---- running calls -----------------------------------------------------------------------------

    async def read(self, body: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[T]]) -> T:
        """Run ``body`` on a pooled connection in autocommit: each statement sees committed data."""
        return await self._call(body, "read")

    async def write(self, body: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[T]]) -> T:
        """Run ``body`` in one transaction: applied whole or not at all. A cancelled call is settled
        (committed or rolled back) before the cancellation propagates; psycopg waits for the server."""
        return await self._call(body, "transaction")

    async def statement(self, body: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[T]]) -> T:
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
        pool = await self.ready()
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
                raise self.mapped(exc, committing=stage == "commit") from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def close(self, last: Callable[[], None]) -> None:
        """Close the pool's connections (waiting for calls in flight), ``last()`` once the pool is no
        longer handed out. Idempotent."""
        if self.closed:
            return
        self.closed = True
        async with self._open_lock:
            pool, self._pool = self._pool, None
        last()
        if pool is not None:
            await pool.close()
