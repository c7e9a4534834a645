"""The fleet's queries of a :class:`~dispatch.records.SqliteStore` (:class:`~dispatch.records.Leasing`):
:class:`SqliteLeasing`, which the store is.

Members and their heartbeats (table ``members``), the revisions of what a holder leases (index
``records_by_holder``), the records a member asks for, the claimable pages, the counts by state, and
leases renewed many at a time, each call one read or one write transaction of the store's file.
"""

from __future__ import annotations

import builtins
import sqlite3
from collections.abc import Collection, Iterable

from dispatch.clock import Clock
from dispatch.errors import ConflictError
from dispatch.model import JobRecord, State, check_job_id
from dispatch.records._common import check_holder, check_states, check_ttl, lease_after_acquire, state_counts
from dispatch.records.sqlite_file import SqliteFile
from dispatch.records.store import Listing, check_leasing, check_page, read_rows

__all__ = ["SqliteLeasing"]


class SqliteLeasing:
    """The :class:`~dispatch.records.Leasing` queries over the store's file ``_file`` and ``_clock``
    (the store's own)."""

    _file: SqliteFile
    _clock: Clock

    def _decode(self, job_id: str, text: str) -> JobRecord:
        raise NotImplementedError  # the store's: a stored document read (cached)

    def _replace_row(self, conn: sqlite3.Connection, record: JobRecord) -> None:
        raise NotImplementedError  # the store's: a record's row written

    async def heartbeat(
        self, group: str, holder: str, ttl: float, *, join: bool = False
    ) -> builtins.list[str]:
        """Renew ``holder``'s membership of ``group`` (or start one, when ``join``), end those that
        lapsed and their holders' leases; the live members, sorted (see
        :class:`~dispatch.records.store.Leasing`)."""
        check_leasing(group, holder)
        seconds = check_ttl(ttl)

        def body(conn: sqlite3.Connection) -> builtins.list[str]:
            now = self._clock.now()
            renewed = conn.execute(
                "UPDATE members SET expires_at = ? WHERE grp = ? AND holder = ?",
                (now + seconds, group, holder),
            ).rowcount
            if not renewed and join:
                if not _member(conn, holder):
                    self._end_leases(conn, holder, now, release=False)  # an earlier membership's
                conn.execute(
                    "INSERT INTO members (grp, holder, expires_at) VALUES (?, ?, ?)",
                    (group, holder, now + seconds),
                )
            ended = conn.execute(
                "SELECT DISTINCT holder FROM members WHERE expires_at <= ?", (now,)
            ).fetchall()
            conn.execute("DELETE FROM members WHERE expires_at <= ?", (now,))
            for (gone,) in ended:
                if not _member(conn, str(gone)):
                    self._end_leases(conn, str(gone), now, release=False)
            rows = conn.execute("SELECT holder FROM members WHERE grp = ? ORDER BY holder", (group,))
            return [str(r[0]) for r in rows.fetchall()]

        return await self._file.write(body)

    async def leave(self, group: str, holder: str) -> None:
        """End ``holder``'s membership of ``group`` now, and its leases once it is a member of no group
        (see :class:`~dispatch.records.store.Leasing`)."""
        check_leasing(group, holder)

        def body(conn: sqlite3.Connection) -> None:
            left = conn.execute("DELETE FROM members WHERE grp = ? AND holder = ?", (group, holder)).rowcount
            if left and not _member(conn, holder):
                self._end_leases(conn, holder, self._clock.now(), release=True)

        await self._file.write(body)

    async def member_lease(self, group: str, job_id: str, holder: str, ttl: float) -> JobRecord:
        """:meth:`acquire_lease`, only while ``holder`` is a member of ``group`` (see
        :class:`~dispatch.records.store.Leasing`): one transaction, as the heartbeat that would end it."""
        check_job_id(job_id)
        check_leasing(group, holder)
        seconds = check_ttl(ttl)

        def body(conn: sqlite3.Connection) -> JobRecord:
            if not _member(conn, holder, group):
                raise ConflictError(f"{holder!r} is not a member of {group!r}: its membership ended")
            return self._acquire(conn, job_id, holder, seconds)

        return await self._file.write(body)

    def _acquire(self, conn: sqlite3.Connection, job_id: str, holder: str, seconds: float) -> JobRecord:
        raise NotImplementedError  # the store's: a lease taken (acquire_lease's rule)

    def _end_leases(self, conn: sqlite3.Connection, holder: str, now: float, *, release: bool) -> None:
        """``holder``'s live leases end ``now`` (its membership did), or are given back (``release``)."""
        rows = conn.execute(
            """SELECT job_id, body FROM records WHERE lease_holder = ?
               AND (? OR lease_expires_at > ?)""",
            (holder, release, now),
        ).fetchall()
        for job_id, text in rows:
            current = self._decode(str(job_id), text)
            assert current.lease is not None  # the query's
            lease = None if release else current.lease.replace(expires_at=now)
            self._replace_row(
                conn, current.replace(lease=lease, revision=current.revision + 1, updated_at=now)
            )

    async def held(self, holder: str, *, after: str = "", limit: int | None = None) -> dict[str, int]:
        """The revision of every record ``holder`` leases after ``after``, at most ``limit`` (see
        :class:`~dispatch.records.store.Leasing`)."""
        check_page(holder, after, limit)

        def body(conn: sqlite3.Connection) -> dict[str, int]:
            rows = conn.execute(
                """SELECT job_id, revision FROM records WHERE lease_holder = ? AND job_id > ?
                   ORDER BY job_id LIMIT ?""",
                (holder, after, -1 if limit is None else limit),
            )
            return {str(jid): int(rev) for jid, rev in rows.fetchall()}

        return await self._file.read(body)

    async def leasable(
        self,
        holder: str,
        *,
        states: Iterable[State],
        limit: int,
        after: str = "",
        held: Collection[str] | None = None,
    ) -> Listing:
        """The records ``holder`` leases, then a page of at most ``limit`` claimable ones in ``states``
        after ``after``, by job id (see :class:`~dispatch.records.store.Leasing`)."""
        check_leasing("-", holder, limit)
        wanted = sorted(s.value for s in check_states(states) or ())
        marks = ", ".join("?" for _ in wanted)

        ids = None if held is None else sorted({check_job_id(j) for j in held})

        def body(conn: sqlite3.Connection) -> Listing:
            if ids is None:
                mine = conn.execute(
                    "SELECT job_id, body FROM records WHERE lease_holder = ? ORDER BY job_id", (holder,)
                ).fetchall()
            else:  # in batches: SQLite bounds the parameters of one statement
                mine = []
                for i in range(0, len(ids), 500):
                    batch = ids[i : i + 500]
                    qs = ", ".join("?" for _ in batch)
                    mine += conn.execute(
                        f"SELECT job_id, body FROM records WHERE lease_holder = ? AND job_id IN ({qs})",
                        (holder, *batch),
                    ).fetchall()
                mine.sort()
            free = conn.execute(
                f"""SELECT job_id, body FROM records
                    WHERE state IN ({marks}) AND job_id > ? AND lease_holder IS NOT ?
                      AND (lease_holder IS NULL OR lease_expires_at <= ?)
                    ORDER BY job_id LIMIT ?""",
                (*wanted, str(after), holder, self._clock.now(), limit),
            ).fetchall()
            return read_rows([*mine, *free], self._decode)

        return await self._file.read(body)

    async def records(self, job_ids: Collection[str], *, states: Iterable[State] | None = None) -> Listing:
        """The records of ``job_ids`` (in ``states``), by job id (see :class:`~dispatch.records.store.Leasing`)."""
        ids = sorted({check_job_id(j) for j in job_ids})
        wanted = check_states(states)

        def body(conn: sqlite3.Connection) -> Listing:
            rows = []
            for i in range(0, len(ids), 500):  # SQLite bounds the parameters of one statement
                batch = ids[i : i + 500]
                qs = ", ".join("?" for _ in batch)
                rows += conn.execute(
                    f"SELECT job_id, state, body FROM records WHERE job_id IN ({qs})", batch
                ).fetchall()
            rows.sort()
            names = None if wanted is None else {s.value for s in wanted}
            chosen = [(jid, body) for jid, state, body in rows if names is None or state in names]
            return read_rows(chosen, self._decode)

        return await self._file.read(body)

    async def counts(self) -> dict[State, int]:
        """How many records there are in each state (see :class:`~dispatch.records.store.Leasing`)."""

        def body(conn: sqlite3.Connection) -> dict[State, int]:
            rows = conn.execute("SELECT state, COUNT(*) FROM records GROUP BY state").fetchall()
            return state_counts(rows)

        return await self._file.read(body)

    async def renew_leases(
        self, holder: str, ttl: float, job_ids: Iterable[str], *, group: str | None = None
    ) -> builtins.list[JobRecord]:
        """Renew ``holder``'s leases on ``job_ids`` in one transaction (with ``group``: while a member of
        it); the records renewed."""
        check_holder(holder)
        seconds = check_ttl(ttl)
        ids = [check_job_id(j) for j in job_ids]

        def body(conn: sqlite3.Connection) -> builtins.list[JobRecord]:
            now = self._clock.now()
            out: builtins.list[JobRecord] = []
            if group is not None and not _member(conn, holder, group):
                return out
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

        return await self._file.write(body)


def _member(conn: sqlite3.Connection, holder: str, group: str | None = None) -> bool:
    """Whether ``holder`` is a member of ``group`` (``None``: of some group), live or lapsed, not yet ended."""
    if group is None:
        row = conn.execute("SELECT 1 FROM members WHERE holder = ? LIMIT 1", (holder,)).fetchone()
    else:
        row = conn.execute("SELECT 1 FROM members WHERE grp = ? AND holder = ?", (group, holder)).fetchone()
    return row is not None
