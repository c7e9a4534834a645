"""The fleet's queries of a :class:`~dispatch.records.PostgresStore` (:class:`~dispatch.records.Leasing`):
:class:`PostgresLeasing`, which the store is.

Members and their heartbeats (``dispatch_members``), the revisions of what a holder leases (the lease
holder index, no document read), the records a member asks for, the claimable pages, the counts by
state, and leases renewed many at a time — each one statement or a few in one call, the time read
from the database's clock as for every write (see the store's module docstring).
"""

from __future__ import annotations

import builtins
from collections.abc import Collection, Iterable
from typing import Any

from psycopg import AsyncConnection

from dispatch.model import JobRecord, State, check_job_id
from dispatch.records._common import check_holder, check_states, check_ttl, state_counts
from dispatch.records.postgres_db import NOW, PostgresDatabase
from dispatch.records.postgres_rows import ROW, Rows
from dispatch.records.store import Listing, check_leasing, check_page

__all__ = ["ACQUIRE", "MEMBER_ACQUIRE", "PostgresLeasing", "is_member"]


_CLAIMABLE = f"""SELECT * FROM (
        (SELECT job_id, {ROW} FROM dispatch_records
         WHERE lease_holder IS NULL AND state = ANY(%(states)s) AND job_id > %(after)s
         ORDER BY job_id LIMIT %(limit)s)
        UNION ALL
        (SELECT job_id, {ROW} FROM dispatch_records
         WHERE lease_expires_at <= (SELECT {NOW}) AND lease_holder <> %(holder)s
           AND state = ANY(%(states)s) AND job_id > %(after)s
         ORDER BY lease_expires_at LIMIT %(limit)s)
    ) AS claimable ORDER BY job_id LIMIT %(limit)s"""
"""A page of claimable records (:meth:`PostgresLeasing.leasable`): the free ones, by job id, and those
whose lease lapsed, found by the lease expiry index. One condition (``lease_holder IS NULL OR
lease_expires_at <= now``) could use neither index — the time is read from a volatile clock — so it
read every row, 60–110 ms at 100,000 records all leased, at every scan. When more than a page of leases
lapsed at once (a member died), the page holds those that lapsed first; the others come in the next
pages, or when the pages start over."""


ACQUIRE = f"""UPDATE dispatch_records
    SET lease_holder = %(holder)s, lease_expires_at = {NOW} + %(ttl)s, revision = revision + 1,
        updated_at = {NOW}
    WHERE job_id = %(job_id)s
      AND (lease_holder IS NULL OR lease_holder = %(holder)s OR lease_expires_at <= {NOW})
    RETURNING {ROW}"""
"""A lease taken or renewed (:func:`~dispatch.records._common.lease_after_acquire`'s rule, in the
statement): the lease columns, revision and ``updated_at``; the document stays as it is."""

_MEMBER = """(%(group)s::text IS NULL OR EXISTS (SELECT 1 FROM dispatch_members
        WHERE grp = %(group)s AND holder = %(holder)s FOR SHARE))"""
"""The holder is a member of the group (no group: no condition), its row share-locked until the
statement's end: a heartbeat ending that membership (a ``DELETE`` of the row) waits for it, and its
``UPDATE`` of the holder's leases then sees what the statement wrote."""

MEMBER_ACQUIRE = ACQUIRE.replace("RETURNING", f"AND {_MEMBER}\n    RETURNING")
"""A member's lease taken or renewed (:meth:`PostgresLeasing.member_lease`)."""


class PostgresLeasing:
    """The :class:`~dispatch.records.Leasing` queries over the store's database ``_db`` and rows
    ``_rows`` (the store's own: a store is its own fleet's store)."""

    _db: PostgresDatabase
    _rows: Rows

    def _now(self) -> float | None:
        raise NotImplementedError  # the store's: its test clock, or None for the server's

    async def _time(self, conn: AsyncConnection[tuple[Any, ...]]) -> float:
        raise NotImplementedError  # the store's: the time of a write, read on ``conn``

    async def heartbeat(
        self, group: str, holder: str, ttl: float, *, join: bool = False
    ) -> builtins.list[str]:
        """Renew ``holder``'s membership of ``group`` (or start one, when ``join``), end those that
        lapsed and their holders' leases, by the database's clock; the live members, sorted (see
        :class:`~dispatch.records.store.Leasing`). One transaction: a membership ends together with
        its leases, and a member renewing it at that moment waits for the row's lock, then finds it
        gone (or renewed: then it did not end)."""
        check_leasing(group, holder)
        seconds = check_ttl(ttl)

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> builtins.list[str]:
            now = await self._time(conn)
            cur = await conn.execute(
                "UPDATE dispatch_members SET expires_at = %s WHERE grp = %s AND holder = %s",
                (now + seconds, group, holder),
            )
            if not cur.rowcount and join:
                await _end_leases(conn, [holder], now)  # an earlier membership's, if it has no other
                await conn.execute(
                    "INSERT INTO dispatch_members (grp, holder, expires_at) VALUES (%s, %s, %s)",
                    (group, holder, now + seconds),
                )
            cur = await conn.execute(
                "DELETE FROM dispatch_members WHERE expires_at <= %s RETURNING holder", (now,)
            )
            await _end_leases(conn, sorted({str(r[0]) for r in await cur.fetchall()}), now)
            cur = await conn.execute(
                "SELECT holder FROM dispatch_members WHERE grp = %s ORDER BY holder", (group,)
            )
            return [str(r[0]) for r in await cur.fetchall()]

        return await self._db.write(body)

    async def member_lease(self, group: str, job_id: str, holder: str, ttl: float) -> JobRecord:
        """:meth:`acquire_lease`, only while ``holder`` is a member of ``group`` (see
        :class:`~dispatch.records.store.Leasing`): the lease statement with the membership in its
        condition, its row share-locked, so a heartbeat ending the membership waits for the take and
        then ends the lease too — or the take waits for it, and finds no membership."""
        check_job_id(job_id)
        check_leasing(group, holder)
        return await self._take(job_id, holder, check_ttl(ttl), group)

    async def _take(self, job_id: str, holder: str, seconds: float, group: str | None = None) -> JobRecord:
        raise NotImplementedError  # the store's: a lease taken, with acquire_lease's rule

    async def leave(self, group: str, holder: str) -> None:
        """End ``holder``'s membership of ``group`` now, and give back its leases once it is a member of
        no group (see :class:`~dispatch.records.store.Leasing`): one statement for all of them, where
        giving back 100,000 one call each took a closing supervisor over a minute."""
        check_leasing(group, holder)

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> None:
            cur = await conn.execute(
                "DELETE FROM dispatch_members WHERE grp = %s AND holder = %s", (group, holder)
            )
            if cur.rowcount:
                await conn.execute(
                    f"""UPDATE dispatch_records SET lease_holder = NULL, lease_expires_at = NULL,
                            revision = revision + 1, updated_at = {NOW}
                        WHERE lease_holder = %(holder)s
                          AND NOT EXISTS (SELECT 1 FROM dispatch_members WHERE holder = %(holder)s)""",
                    {"holder": holder, "now": self._now()},
                )

        await self._db.write(body)

    async def held(self, holder: str, *, after: str = "", limit: int | None = None) -> dict[str, int]:
        """The revision of every record ``holder`` leases after ``after``, at most ``limit`` (see
        :class:`~dispatch.records.store.Leasing`): no document read. A page is a walk of the job id index
        from ``after`` (2,000 leases of 100,000: 2–4 ms); all of them at once took 200–400 ms, most of it
        sorting 100,000 rows on disk."""
        check_page(holder, after, limit)

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> dict[str, int]:
            cur = await conn.execute(
                """SELECT job_id, revision FROM dispatch_records WHERE lease_holder = %s AND job_id > %s
                   ORDER BY job_id LIMIT %s""",
                (holder, after, limit),
            )
            return {str(jid): int(rev) for jid, rev in await cur.fetchall()}

        return await self._db.read(body)

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
        after ``after``, by job id; expiry judged by the database's clock (see
        :class:`~dispatch.records.store.Leasing`)."""
        check_leasing("-", holder, limit)
        wanted = sorted(s.value for s in check_states(states) or ())

        ids = None if held is None else sorted({check_job_id(j) for j in held})

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> Listing:
            rows: builtins.list[tuple[Any, ...]] = []
            if ids is None:
                cur = await conn.execute(
                    f"SELECT job_id, {ROW} FROM dispatch_records WHERE lease_holder = %s ORDER BY job_id",
                    (holder,),
                )
                rows = await cur.fetchall()
            elif ids:
                cur = await conn.execute(
                    f"""SELECT job_id, {ROW} FROM dispatch_records
                        WHERE lease_holder = %s AND job_id = ANY(%s) ORDER BY job_id""",
                    (holder, ids),
                )
                rows = await cur.fetchall()
            free = await conn.execute(
                _CLAIMABLE,
                {"states": wanted, "after": str(after), "holder": holder, "limit": limit, "now": self._now()},
            )
            return self._rows.rows([*rows, *await free.fetchall()])

        return await self._db.read(body)

    async def records(self, job_ids: Collection[str], *, states: Iterable[State] | None = None) -> Listing:
        """The records of ``job_ids`` (in ``states``), by job id (see :class:`~dispatch.records.store.Leasing`)."""
        ids = sorted({check_job_id(j) for j in job_ids})
        wanted = check_states(states)

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> Listing:
            if wanted is None:
                cur = await conn.execute(
                    f"SELECT job_id, {ROW} FROM dispatch_records WHERE job_id = ANY(%s) ORDER BY job_id",
                    (ids,),
                )
            else:
                cur = await conn.execute(
                    f"""SELECT job_id, {ROW} FROM dispatch_records
                        WHERE job_id = ANY(%s) AND state = ANY(%s) ORDER BY job_id""",
                    (ids, sorted(s.value for s in wanted)),
                )
            return self._rows.rows(await cur.fetchall())

        return await self._db.read(body)

    async def counts(self) -> dict[State, int]:
        """How many records there are in each state (see :class:`~dispatch.records.store.Leasing`): one
        aggregate over the state index, no record read."""

        async def body(conn: AsyncConnection[tuple[Any, ...]]) -> dict[State, int]:
            cur = await conn.execute("SELECT state, count(*) FROM dispatch_records GROUP BY state")
            return state_counts(await cur.fetchall())

        return await self._db.read(body)

    async def renew_leases(
        self, holder: str, ttl: float, job_ids: Iterable[str], *, group: str | None = None
    ) -> builtins.list[JobRecord]:
        """Renew ``holder``'s leases on ``job_ids`` in one transaction, by the database's clock (with
        ``group``: while a member of it, its row locked against a heartbeat ending it meanwhile); the
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
                    SET lease_expires_at = {NOW} + %(ttl)s, revision = revision + 1, updated_at = {NOW}
                    WHERE job_id IN (SELECT job_id FROM dispatch_records
                                     WHERE job_id = ANY(%(ids)s) AND lease_holder = %(holder)s
                                     ORDER BY job_id FOR UPDATE)
                      AND lease_holder = %(holder)s AND {_MEMBER}
                    RETURNING job_id, {ROW}""",
                {"ids": ids, "holder": holder, "ttl": seconds, "now": self._now(), "group": group},
            )
            rows = sorted(await cur.fetchall(), key=lambda row: str(row[0]))
            return [self._rows.decode(str(row[0]), row[1:]) for row in rows]

        # Autocommit: one statement is one transaction. Run again after a lost connection, it renews
        # the same leases (a lease is renewed from the time it is written), so it is a read's retry.
        return await self._db.read(body)


async def _end_leases(
    conn: AsyncConnection[tuple[Any, ...]], holders: builtins.list[str], now: float
) -> None:
    """The live leases of those of ``holders`` that are a member of no group end at ``now`` (their
    membership did): one statement, found by the lease holder index."""
    if holders:
        await conn.execute(
            """UPDATE dispatch_records SET lease_expires_at = %(now)s, revision = revision + 1,
                   updated_at = %(now)s
               WHERE lease_holder = ANY(%(holders)s) AND lease_expires_at > %(now)s
                 AND NOT EXISTS (SELECT 1 FROM dispatch_members m WHERE m.holder = lease_holder)""",
            {"holders": holders, "now": now},
        )


async def is_member(conn: AsyncConnection[tuple[Any, ...]], group: str, holder: str) -> bool:
    """Whether ``holder`` is a member of ``group`` (live or lapsed, not yet ended)."""
    cur = await conn.execute("SELECT 1 FROM dispatch_members WHERE grp = %s AND holder = %s", (group, holder))
    return await cur.fetchone() is not None
