"""An in-process :class:`~dispatch.records.Store` for tests and simulations.

Same semantics as :class:`~dispatch.records.SqliteStore` (the same checks and lease rules, from
``_common``), kept in dictionaries. Records and transitions are frozen; the one mutable thing a record
can carry, the value of an extension whose type is unknown here, is decoded afresh on every read, so no
caller can change what the store holds.
"""

from __future__ import annotations

import bisect
import builtins
import threading
from collections.abc import Collection, Iterable, Sequence

from dispatch.clock import Clock, SystemClock
from dispatch.errors import ConflictError, NotFoundError, UnavailableError
from dispatch.model import JobRecord, State, Transition, check_job_id
from dispatch.records._common import (
    QueueChanges,
    check_cutoff,
    check_holder,
    check_revision,
    check_states,
    check_ttl,
    checked_record,
    checked_transition,
    checked_transitions,
    lease_after_acquire,
    lease_after_release,
)
from dispatch.records.store import Listing, check_key_value, check_leasing, check_page

__all__ = ["MemoryStore"]

_WHERE = "the memory store"


class MemoryStore:
    """Job records in process memory: fast, and gone when the process ends.

    Every method completes without yielding to the event loop, and a lock guards the maps, so
    concurrent tasks (and threads) see each write whole. ``clock`` stamps ``updated_at`` and judges
    lease expiry (default: the system clock).
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._lock = threading.Lock()
        self._records: dict[str, JobRecord] = {}  # insertion order is creation order: oldest first
        self._by_id: builtins.list[str] | None = (
            None  # the job ids sorted, made again after a create or purge
        )
        self._history: dict[str, builtins.list[Transition]] = {}
        self._values: dict[str, str] = {}
        self._members: dict[tuple[str, str], float] = {}  # (group, holder) -> membership expiry
        self._closed = False
        self._subscribers: set[QueueChanges] = set()

    def __repr__(self) -> str:
        return f"MemoryStore({len(self._records)} records{', closed' if self._closed else ''})"

    def _check_open(self) -> None:
        if self._closed:
            raise UnavailableError("the memory store is closed")

    def _current(self, job_id: str) -> JobRecord:
        record = self._records.get(job_id)
        if record is None:
            raise NotFoundError(f"no record for job {job_id!r}")
        return record

    def _put(self, record: JobRecord) -> JobRecord:
        # Records are immutable, unknown extensions' values included: handed out as kept, never copied.
        self._records[record.job_id] = record
        self._notify(record.job_id)
        return record

    def _notify(self, job_id: str | None) -> None:
        for feed in builtins.list(self._subscribers):
            feed.push(job_id)

    def changes(self) -> QueueChanges:
        """Subscribe to this store's writes (see :class:`~dispatch.records.Changes`): in-process only,
        as the records are."""
        return QueueChanges(self._subscribers, _WHERE, lambda: self._closed)

    async def create(self, record: JobRecord, transition: Transition) -> JobRecord:
        """Insert a new record (stored with revision 1) and its first transition.
        ``ConflictError`` if the job id is taken."""
        checked = checked_record(record)
        first, _ = checked_transition(checked.job_id, transition, "transition")
        with self._lock:
            self._check_open()
            if checked.job_id in self._records:
                raise ConflictError(f"a record for job {checked.job_id!r} already exists")
            now = self._clock.now()
            stored = self._put(checked.replace(revision=1, updated_at=now))
            self._history[checked.job_id] = [first]
            self._by_id = None
            return stored

    async def get(self, job_id: str) -> JobRecord:
        """The current record. ``NotFoundError`` if there is none."""
        check_job_id(job_id)
        with self._lock:
            self._check_open()
            return self._current(job_id)

    async def list(self, *, states: Iterable[State] | None = None) -> Listing:
        """Every record (optionally only those in ``states``), oldest first (it keeps no unreadable one)."""
        wanted = check_states(states)
        with self._lock:
            self._check_open()
            return Listing(r for r in self._records.values() if wanted is None or r.outcome.state in wanted)

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
        with self._lock:
            self._check_open()
            current = self._current(checked.job_id)
            if current.revision != expected_revision:
                raise ConflictError(
                    f"job {checked.job_id!r} is at revision {current.revision}, not {expected_revision}: "
                    "it changed since it was read"
                )
            stored = self._put(
                checked.replace(
                    revision=current.revision + 1,
                    updated_at=self._clock.now(),
                    created_at=current.created_at,
                    lease=current.lease,
                )
            )
            self._history[checked.job_id].extend(t for t, _ in added)
            return stored

    async def history(self, job_id: str) -> builtins.list[Transition]:
        """The record's transitions, oldest first. ``NotFoundError`` if there is no record."""
        check_job_id(job_id)
        with self._lock:
            self._check_open()
            self._current(job_id)
            return builtins.list(self._history[job_id])

    async def acquire_lease(self, job_id: str, holder: str, ttl: float) -> JobRecord:
        """Take or renew the lease on a record for ``ttl`` seconds. Succeeds when there is no lease, it
        has expired, or ``holder`` already holds it; otherwise ``ConflictError`` naming the holder."""
        check_job_id(job_id)
        check_holder(holder)
        seconds = check_ttl(ttl)
        with self._lock:
            self._check_open()
            return self._acquire(job_id, holder, seconds)

    def _acquire(self, job_id: str, holder: str, seconds: float) -> JobRecord:
        current = self._current(job_id)
        now = self._clock.now()
        lease = lease_after_acquire(job_id, current.lease, holder, seconds, now)
        return self._put(current.replace(lease=lease, revision=current.revision + 1, updated_at=now))

    async def member_lease(self, group: str, job_id: str, holder: str, ttl: float) -> JobRecord:
        """:meth:`acquire_lease`, only while ``holder`` is a member of ``group`` (see
        :class:`~dispatch.records.store.Leasing`)."""
        check_job_id(job_id)
        check_leasing(group, holder)
        seconds = check_ttl(ttl)
        with self._lock:
            self._check_open()
            if (group, holder) not in self._members:
                raise ConflictError(f"{holder!r} is not a member of {group!r}: its membership ended")
            return self._acquire(job_id, holder, seconds)

    async def release_lease(self, job_id: str, holder: str) -> JobRecord:
        """Give up a lease held by ``holder``. ``ConflictError`` if another holder has it now.
        Releasing when nobody holds a live lease changes nothing (and does not bump the revision)."""
        check_job_id(job_id)
        check_holder(holder)
        with self._lock:
            self._check_open()
            current = self._current(job_id)
            now = self._clock.now()
            changed, lease = lease_after_release(job_id, current.lease, holder, now)
            if not changed:
                return current
            return self._put(current.replace(lease=lease, revision=current.revision + 1, updated_at=now))

    async def purge(self, older_than: float) -> int:
        """Delete terminal records (and their history) last updated before ``older_than`` (epoch
        seconds). Returns how many were deleted. Non-terminal records are never purged, nor records
        under a live lease."""
        cutoff = check_cutoff(older_than)
        with self._lock:
            self._check_open()
            now = self._clock.now()
            doomed = [
                job_id
                for job_id, r in self._records.items()
                if r.outcome.state.terminal
                and r.updated_at < cutoff
                and (r.lease is None or not r.lease.live(now))
            ]
            for job_id in doomed:
                del self._records[job_id]
                del self._history[job_id]
                self._notify(job_id)
            if doomed:
                self._by_id = None
            return len(doomed)

    async def heartbeat(
        self, group: str, holder: str, ttl: float, *, join: bool = False
    ) -> builtins.list[str]:
        """Renew ``holder``'s membership of ``group`` (or start one, when ``join``), end those that
        lapsed and their holders' leases; the live members, sorted (see
        :class:`~dispatch.records.store.Leasing`)."""
        check_leasing(group, holder)
        seconds = check_ttl(ttl)
        with self._lock:
            self._check_open()
            now = self._clock.now()
            key = (group, holder)
            if key in self._members or join:
                if key not in self._members and not self._member(holder):
                    self._end_leases({holder}, now)  # an earlier membership's: they ended with it
                self._members[key] = now + seconds
            ended = [k for k, until in self._members.items() if until <= now]
            for k in ended:
                del self._members[k]
            self._end_leases({h for _, h in ended if not self._member(h)}, now)
            return sorted(h for g, h in self._members if g == group)

    async def leave(self, group: str, holder: str) -> None:
        """End ``holder``'s membership of ``group`` now, and its leases once it is a member of no group
        (see :class:`~dispatch.records.store.Leasing`)."""
        check_leasing(group, holder)
        with self._lock:
            self._check_open()
            if self._members.pop((group, holder), None) is not None and not self._member(holder):
                self._end_leases({holder}, self._clock.now(), release=True)

    def _member(self, holder: str) -> bool:
        return any(h == holder for _, h in self._members)

    def _end_leases(self, holders: Collection[str], now: float, *, release: bool = False) -> None:
        """The live leases of ``holders`` end ``now`` (their memberships did), or every lease of theirs
        is given back (``release``)."""
        if not holders:
            return
        for rec in builtins.list(self._records.values()):
            lease = rec.lease
            if lease is not None and lease.holder in holders and (release or lease.live(now)):
                ended = None if release else lease.replace(expires_at=now)
                self._put(rec.replace(lease=ended, revision=rec.revision + 1, updated_at=now))

    async def held(self, holder: str, *, after: str = "", limit: int | None = None) -> dict[str, int]:
        """The revision of every record ``holder`` leases after ``after``, at most ``limit`` (see
        :class:`~dispatch.records.store.Leasing`)."""
        check_page(holder, after, limit)
        with self._lock:
            self._check_open()
            by_id = self._sorted_ids()
            out: dict[str, int] = {}
            # From ``after`` on, in job id order, until the page is full: a page costs its own size (and
            # the records of other holders among them), not a pass over every record.
            for i in range(bisect.bisect_right(by_id, after), len(by_id)):
                if limit is not None and len(out) >= limit:
                    break
                r = self._records[by_id[i]]
                if r.lease is not None and r.lease.holder == holder:
                    out[r.job_id] = r.revision
            return out

    def _sorted_ids(self) -> builtins.list[str]:
        """Every job id, sorted (under the lock)."""
        if self._by_id is None:
            self._by_id = sorted(self._records)
        return self._by_id

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
        wanted = check_states(states) or frozenset()
        with self._lock:
            self._check_open()
            now = self._clock.now()
            by_id = self._sorted_ids()
            # Those asked for looked up, not a pass over every record; the page walked from ``after``
            # until it is full (a sort of every record at every scan was 100–200 ms at 100,000).
            candidates = by_id if held is None else sorted(set(held) & self._records.keys())
            mine = [
                r
                for r in (self._records[j] for j in candidates)
                if r.lease is not None and r.lease.holder == holder
            ]
            free: builtins.list[JobRecord] = []
            for i in range(bisect.bisect_right(by_id, after), len(by_id)):
                if len(free) >= limit:
                    break
                r = self._records[by_id[i]]
                if r.outcome.state in wanted and (
                    r.lease is None or (r.lease.holder != holder and not r.lease.live(now))
                ):
                    free.append(r)
            return Listing([*mine, *free])

    async def records(self, job_ids: Collection[str], *, states: Iterable[State] | None = None) -> Listing:
        """The records of ``job_ids`` (in ``states``), by job id (see :class:`~dispatch.records.store.Leasing`)."""
        ids = sorted({check_job_id(j) for j in job_ids})
        wanted = check_states(states)
        with self._lock:
            self._check_open()
            found = (self._records.get(j) for j in ids)
            return Listing(
                r for r in found if r is not None and (wanted is None or r.outcome.state in wanted)
            )

    async def counts(self) -> dict[State, int]:
        """How many records there are in each state (see :class:`~dispatch.records.store.Leasing`)."""
        with self._lock:
            self._check_open()
            out: dict[State, int] = {}
            for rec in self._records.values():
                out[rec.outcome.state] = out.get(rec.outcome.state, 0) + 1
            return out

    async def renew_leases(
        self, holder: str, ttl: float, job_ids: Iterable[str], *, group: str | None = None
    ) -> builtins.list[JobRecord]:
        """Renew ``holder``'s leases on ``job_ids`` in one call (with ``group``: while a member of it);
        the records renewed."""
        check_holder(holder)
        seconds = check_ttl(ttl)
        ids = [check_job_id(j) for j in job_ids]
        out: builtins.list[JobRecord] = []
        with self._lock:
            self._check_open()
            if group is not None and (group, holder) not in self._members:
                return out
            now = self._clock.now()
            for job_id in ids:
                current = self._records.get(job_id)
                if current is None or current.lease is None or current.lease.holder != holder:
                    continue
                lease = lease_after_acquire(job_id, current.lease, holder, seconds, now)
                out.append(
                    self._put(current.replace(lease=lease, revision=current.revision + 1, updated_at=now))
                )
            return out

    async def get_value(self, key: str) -> str | None:
        """The value kept under ``key`` (see :class:`~dispatch.records.store.KeyValues`), or ``None``."""
        check_key_value(key, None)
        with self._lock:
            self._check_open()
            return self._values.get(key)

    async def put_value(self, key: str, value: str | None) -> None:
        """Keep ``value`` under ``key``; ``None`` removes it."""
        check_key_value(key, value)
        with self._lock:
            self._check_open()
            if value is None:
                self._values.pop(key, None)
            else:
                self._values[key] = value

    async def add_value(self, key: str, value: str) -> str:
        """Keep ``value`` under ``key`` unless a value is there already; return the value kept."""
        check_key_value(key, value)
        with self._lock:
            self._check_open()
            return self._values.setdefault(key, value)

    async def close(self) -> None:
        """Forget nothing, accept nothing more. Idempotent."""
        with self._lock:
            if not self._closed:
                self._closed = True
                self._notify(None)
