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

The database (connecting, migrating, the pool, running a call, the errors) is
:mod:`dispatch.records.postgres_db`; a record's row, and the documents already decoded,
:mod:`dispatch.records.postgres_rows`; the fleet's queries (:class:`~dispatch.records.Leasing`),
:mod:`dispatch.records.postgres_leasing`; the records, leases and values over them, here.
"""

from __future__ import annotations

import builtins
import functools
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import psycopg
from psycopg import AsyncConnection

from dispatch.clock import Clock
from dispatch.errors import (
    ConflictError,
    NotFoundError,
    UnavailableError,
)
from dispatch.model import JobRecord, State, Transition, check_job_id
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
    decode_transition,
    lease_after_acquire,
    lease_after_release,
)
from dispatch.records.postgres_db import _MIGRATIONS as _MIGRATIONS  # the steps, for the migration tests
from dispatch.records.postgres_db import CHANNEL, NOW, SCHEMA_VERSION, PostgresDatabase
from dispatch.records.postgres_leasing import ACQUIRE, MEMBER_ACQUIRE, PostgresLeasing, is_member
from dispatch.records.postgres_rows import ROW, Rows
from dispatch.records.postgres_url import redact_dsn
from dispatch.records.store import Changes, Listing, check_key_value

__all__ = ["CHANNEL", "SCHEMA_VERSION", "PostgresStore", "redact_dsn"]


_RELEASE = f"""UPDATE dispatch_records
    SET lease_holder = NULL, lease_expires_at = NULL, revision = revision + 1, updated_at = {NOW}
    WHERE job_id = %(job_id)s AND lease_holder = %(holder)s
    RETURNING {ROW}"""
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
            revision = revision + 1, updated_at = {NOW}
        WHERE job_id = %(job_id)s AND revision = %(expected)s
        RETURNING {ROW}"""
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


class PostgresStore(PostgresLeasing):
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
        self._db = PostgresDatabase(
            dsn, max_size=max_size, timeout=timeout, application_name=application_name
        )
        self._clock = clock
        self._rows = Rows(self._db.where)

    def __repr__(self) -> str:
        return f"PostgresStore({self._db.where!r}{', closed' if self._db.closed else ''})"

    def __str__(self) -> str:
        return self._db.where

    @property
    def where(self) -> str:
        """The database, as ``postgresql://user@host:port/dbname`` (no password)."""
        return self._db.where

    def _now(self) -> float | None:
        return self._clock.now() if self._clock is not None else None

    async def _current(self, conn: AsyncConnection[tuple[Any, ...]], job_id: str) -> tuple[JobRecord, float]:
        """The record as committed now, and the time it was read at."""
        cur = await conn.execute(
            f"SELECT {ROW}, {NOW} FROM dispatch_records WHERE job_id = %(job_id)s",
            {"job_id": job_id, "now": self._now()},
        )
        row = await cur.fetchone()
        if row is None:
            raise NotFoundError(f"no record for job {job_id!r}")
        return self._rows.decode(job_id, row), float(row[6])

    async def _time(self, conn: AsyncConnection[tuple[Any, ...]]) -> float:
        if self._clock is not None:
            return self._clock.now()
        row = await (await conn.execute(f"SELECT {NOW}", {"now": None})).fetchone()
        assert row is not None
        return float(row[0])

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
                self._rows.columns(stored),
            )
            if cur.rowcount != 1:
                raise ConflictError(f"a record for job {checked.job_id!r} already exists")
            await conn.execute(
                "INSERT INTO dispatch_history (job_id, seq, body) VALUES (%s, 1, %s)", (stored.job_id, first)
            )
            return stored

        return await self._db.write(body)

    async def get(self, job_id: str) -> JobRecord:
        """The current record. ``NotFoundError`` if there is none."""
        check_job_id(job_id)

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> JobRecord:
            cur = await conn.execute(f"SELECT {ROW} FROM dispatch_records WHERE job_id = %s", (job_id,))
            row = await cur.fetchone()
            if row is None:
                raise NotFoundError(f"no record for job {job_id!r}")
            return self._rows.decode(job_id, row)

        return await self._db.read(body)

    async def list(self, *, states: Iterable[State] | None = None) -> Listing:
        """Every record (optionally only those in ``states``), oldest first; unreadable ones aside."""
        wanted = check_states(states)

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> Listing:
            if wanted is None:
                cur = await conn.execute(f"SELECT job_id, {ROW} FROM dispatch_records ORDER BY seq")
            else:
                cur = await conn.execute(
                    f"SELECT job_id, {ROW} FROM dispatch_records WHERE state = ANY(%s) ORDER BY seq",
                    (sorted(s.value for s in wanted),),
                )
            return self._rows.rows(await cur.fetchall())

        return await self._db.read(body)

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
            self._rows.remember(text, checked)  # harmless if the transaction rolls back: keyed by text
            return self._rows.decode(job_id, row)

        return await self._db.statement(body)

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
                decode_transition(job_id, seq, text, self._db.where) for seq, text in rows if seq is not None
            ]

        return await self._db.read(body)

    async def acquire_lease(self, job_id: str, holder: str, ttl: float) -> JobRecord:
        """Take or renew the lease on a record for ``ttl`` seconds, by the database's clock. Succeeds
        when there is no lease, it has expired, or ``holder`` already holds it; otherwise
        ``ConflictError`` naming the holder."""
        check_job_id(job_id)
        check_holder(holder)
        return await self._take(job_id, holder, check_ttl(ttl))

    async def _take(self, job_id: str, holder: str, seconds: float, group: str | None = None) -> JobRecord:
        """A lease taken or renewed for ``seconds`` (with ``group``: only while ``holder`` is a member of
        it, :meth:`member_lease`)."""

        def refused(current: JobRecord, now: float) -> JobRecord | None:
            lease_after_acquire(job_id, current.lease, holder, seconds, now)  # names the holder
            return None  # it lapsed in between: asked for again

        async def member(conn: AsyncConnection[tuple[Any, ...]]) -> None:
            if group is not None and not await is_member(conn, group, holder):
                raise ConflictError(f"{holder!r} is not a member of {group!r}: its membership ended")

        # Run again after a lost connection, it takes the same lease (the holder's own is renewed).
        params = {"holder": holder, "ttl": seconds, "group": group}
        statement = ACQUIRE if group is None else MEMBER_ACQUIRE
        return await self._lease_change(statement, job_id, params, refused, check=member)

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
        *,
        check: Callable[[AsyncConnection[tuple[Any, ...]]], Awaitable[None]] | None = None,
    ) -> JobRecord:
        """Run a lease change, one statement with the lease rule in its ``WHERE`` (atomic on its own,
        the time read once the row is locked, as renew_leases does), in autocommit. When it changes no
        row, ``check`` raises if a condition of the statement's own failed (a membership), then the
        record as committed now goes to ``refused``, the shared rule of ``_common``: it raises why
        (``ConflictError`` naming the holder), returns the record (nothing to change), or ``None`` (the
        lease moved in between: the statement runs again)."""

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> JobRecord:
            while True:
                args = {**params, "job_id": job_id, "now": self._now()}
                row = await (await conn.execute(statement, args)).fetchone()
                if row is not None:
                    return self._rows.decode(job_id, row)
                if check is not None:
                    await check(conn)
                current, now = await self._current(conn, job_id)
                result = refused(current, now)
                if result is not None:
                    return result

        # Having the same effect when run again, a lease change is retried like a read.
        return await self._db.read(body)

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
                      AND (lease_expires_at IS NULL OR lease_expires_at <= {NOW})
                    RETURNING job_id""",
                {"cutoff": cutoff, "now": self._now()},
            )
            doomed = [job_id for (job_id,) in await cur.fetchall()]
            # Records first: the history trigger allows deleting history only once its record is gone.
            if doomed:
                await conn.execute("DELETE FROM dispatch_history WHERE job_id = ANY(%s)", (doomed,))
            for job_id in doomed:
                self._rows.forget(job_id)
            return len(doomed)

        return await self._db.write(body)

    async def get_value(self, key: str) -> str | None:
        """The value kept under ``key`` (see :class:`~dispatch.records.KeyValues`), or ``None``."""
        check_key_value(key, None)

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> str | None:
            cur = await conn.execute("SELECT value FROM dispatch_kv WHERE key = %s", (key,))
            row = await cur.fetchone()
            return None if row is None else str(row[0])

        return await self._db.read(body)

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

        await self._db.write(body)

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

        return await self._db.write(body)

    def changes(self) -> Changes:
        """Subscribe to every write to the database, by any process on any host, through
        ``LISTEN dispatch_records`` on a connection of the feed's own (see
        :class:`~dispatch.records.Changes`)."""
        return _PostgresChanges(self._db)

    async def close(self) -> None:
        """Close the pool's connections (waiting for calls in flight). Idempotent."""
        await self._db.close(self._rows.clear)


class _PostgresChanges(Changes):
    """``LISTEN dispatch_records`` on a dedicated autocommit connection."""

    _WAKE = 0.25
    """How often a waiting feed looks whether its store was closed (notifications wake it at once)."""

    def __init__(self, db: PostgresDatabase) -> None:
        self._db = db
        self._conn: AsyncConnection[tuple[Any, ...]] | None = None
        self._pending: deque[str] = deque()

    async def _start(self) -> None:
        await self._db.ready()  # the schema (and its trigger) exists before we listen
        conn = await self._db.connect()
        try:
            await conn.execute(f"LISTEN {CHANNEL}")
        except psycopg.Error as exc:
            await conn.close()
            raise self._db.mapped(exc) from None
        self._conn = conn

    async def _next(self) -> str:
        while not self._pending:
            if self._db.closed:
                raise UnavailableError(f"{self._db.where}: the store is closed; its change feed ended")
            if self._conn is None:
                raise UnavailableError(f"{self._db.where}: the change feed is closed")
            # Bounded waits, so a closed store is noticed; nothing is lost between them (unread
            # notifications wait in the socket, or in psycopg's backlog).
            try:
                async for notify in self._conn.notifies(timeout=self._WAKE, stop_after=1):
                    self._pending.append(str(notify.payload))
            except psycopg.Error as exc:
                raise self._db.mapped(exc) from None
        return self._pending.popleft()

    async def _stop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()
