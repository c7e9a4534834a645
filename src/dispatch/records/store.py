"""The :class:`Store` protocol: durable job records with compare-and-swap, leases and history."""

from __future__ import annotations

import abc
import builtins
from collections.abc import Callable, Collection, Iterable, Sequence
from types import TracebackType
from typing import Protocol, TypeVar, runtime_checkable

from msgspec import Struct

from dispatch.errors import InvalidError
from dispatch.model import JobRecord, State, Transition

__all__ = [
    "STORE_ID_KEY",
    "ChangeNotifier",
    "Changes",
    "KeyValues",
    "Leasing",
    "Listing",
    "Store",
    "Unreadable",
    "read_rows",
    "store_identity",
]

R = TypeVar("R")


class Unreadable(Struct, frozen=True):
    """A stored record this process cannot read (corrupt, or written by a newer dispatch): reported on
    its own, never stopping the others."""

    job_id: str
    reason: str

    def __str__(self) -> str:
        return f"{self.job_id}: unreadable record ({self.reason})"


class Listing(builtins.list[JobRecord]):
    """What :meth:`Store.list` returns: the records it could read, in order, and ``unreadable``, one
    entry for each record it could not."""

    __slots__ = ("unreadable",)

    def __init__(self, records: Iterable[JobRecord] = (), unreadable: Iterable[Unreadable] = ()) -> None:
        super().__init__(records)
        self.unreadable: tuple[Unreadable, ...] = tuple(unreadable)


def read_rows(rows: Iterable[tuple[str, R]], decode: Callable[[str, R], JobRecord]) -> Listing:
    """Decode stored ``(job_id, row)`` rows (``row``: the record's text, or whatever ``decode`` reads it
    from) into a :class:`Listing`: a row that does not decode is set aside as :class:`Unreadable` with
    the decoder's reason, and the others are read."""
    records: builtins.list[JobRecord] = []
    bad: builtins.list[Unreadable] = []
    for job_id, text in rows:
        try:
            records.append(decode(job_id, text))
        except InvalidError as exc:
            bad.append(Unreadable(job_id, exc.detail))
    return Listing(records, bad)


@runtime_checkable
class Store(Protocol):
    """One record per job, plus its append-only history of transitions.

    Contract (checked by ``tests/records``, the same tests for every implementation):

    - every write is conditional on the record's ``revision`` (compare-and-swap): a stale write raises
      ``ConflictError`` and changes nothing; a successful one returns the record with ``revision + 1``
      and ``updated_at`` set from the store's clock;
    - a supervisor takes a time-bounded lease on a record before acting on it; an expired lease may be
      taken over by another holder; lease changes are writes (they bump the revision);
    - records are never deleted implicitly; :meth:`purge` is explicit;
    - a write that returned is durable (it survives the process being killed right after).

    Change notification is not part of this protocol but an optional hook, :class:`ChangeNotifier`.
    """

    async def create(self, record: JobRecord, transition: Transition) -> JobRecord:
        """Insert a new record (stored with revision 1) and its first transition.
        ``ConflictError`` if the job id is taken."""
        ...

    async def get(self, job_id: str) -> JobRecord:
        """The current record. ``NotFoundError`` if there is none."""
        ...

    async def list(self, *, states: Iterable[State] | None = None) -> Listing:
        """Every record (optionally only those in ``states``), oldest first. A stored record that cannot
        be read is left out and named in the listing's ``unreadable``."""
        ...

    async def update(
        self, record: JobRecord, *, expected_revision: int, transitions: Sequence[Transition] = ()
    ) -> JobRecord:
        """Replace the record if its stored revision is ``expected_revision``, appending ``transitions``
        atomically with it. ``ConflictError`` if the revision moved, ``NotFoundError`` if it is gone."""
        ...

    async def history(self, job_id: str) -> builtins.list[Transition]:
        """The record's transitions, oldest first. ``NotFoundError`` if there is no record."""
        ...

    async def acquire_lease(self, job_id: str, holder: str, ttl: float) -> JobRecord:
        """Take or renew the lease on a record for ``ttl`` seconds. Succeeds when there is no lease, it
        has expired, or ``holder`` already holds it; otherwise ``ConflictError`` naming the holder."""
        ...

    async def release_lease(self, job_id: str, holder: str) -> JobRecord:
        """Give up a lease held by ``holder``. ``ConflictError`` if another holder has it now."""
        ...

    async def purge(self, older_than: float) -> int:
        """Delete terminal records (and their history) last updated before ``older_than`` (epoch
        seconds). Returns how many were deleted. Non-terminal records are never purged."""
        ...

    async def close(self) -> None:
        """Release the store's resources. Idempotent."""
        ...


class Changes(abc.ABC):
    """A subscription to a store's changes: an async context manager and an async iterator of job ids.

    ``async with store.changes() as feed:`` subscribes; once the ``async with`` body starts, every
    write committed afterwards to the store (by this process or, for shared stores, any other) is
    reported. ``async for job_id in feed`` then yields the id of each record created, updated, leased,
    released or purged. An id is a *hint*, not the change: read the record to learn what it is now.
    Several writes to one record may be reported once, and a write may be reported although the
    reader already saw its effect; nothing committed after subscribing is missed while the feed is
    open. If the feed loses its source (e.g. the database connection), iteration raises
    ``UnavailableError``: subscribe again and re-read (``list``) what may have changed meanwhile.

    The usual pattern (what ``Cluster.watch`` or an idle supervisor does): subscribe, read the
    current records, then act on each reported id.
    """

    _entered = False

    async def __aenter__(self) -> Changes:
        await self._start()
        self._entered = True
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._entered = False
        await self._stop()

    def __aiter__(self) -> Changes:
        return self

    async def __anext__(self) -> str:
        if not self._entered:
            from dispatch.errors import InvalidError

            raise InvalidError("iterate a change feed inside `async with store.changes() as feed`")
        return await self._next()

    @abc.abstractmethod
    async def _start(self) -> None:
        """Subscribe: after this returns, no committed change may be missed."""

    @abc.abstractmethod
    async def _next(self) -> str:
        """The next changed job id (waiting for one)."""

    @abc.abstractmethod
    async def _stop(self) -> None:
        """Unsubscribe and release resources. Idempotent."""


@runtime_checkable
class ChangeNotifier(Protocol):
    """The optional change-notification hook of a :class:`Store` (not part of ``Store`` itself, so a
    store without it is still a store; callers check ``isinstance(store, ChangeNotifier)`` and fall
    back to polling ``list``). All three dispatch stores have it: :class:`MemoryStore` (in-process),
    :class:`SqliteStore` (polls the file's ``data_version``, so other processes' writes show too) and
    :class:`PostgresStore` (``LISTEN/NOTIFY``, so other hosts' writes show too)."""

    def changes(self) -> Changes:
        """A new, not yet started subscription; see :class:`Changes`."""
        ...


@runtime_checkable
class KeyValues(Protocol):
    """Optional small key-value table kept beside the records (all three dispatch stores have it; a
    store without it still satisfies :class:`Store`).

    For host-side caches that must outlive a process and be shared like the records are — today the
    probe findings of an adapter (see :class:`dispatch.config.ProbeCache`). Values are text (JSON by
    convention), at most :data:`MAX_VALUE` characters; keys are non-empty text of at most 512 characters.
    Neither may contain NUL. Writes to it are not reported by :class:`Changes` (they are not records).
    ``put_value`` replaces unconditionally: a cache, not a record (no revision, no history).
    """

    async def get_value(self, key: str) -> str | None:
        """The value stored under ``key``, or ``None``."""
        ...

    async def put_value(self, key: str, value: str | None) -> None:
        """Store ``value`` under ``key`` (``None`` deletes it)."""
        ...

    async def add_value(self, key: str, value: str) -> str:
        """Store ``value`` under ``key`` unless a value is there already (atomically: of two callers,
        one wins and both see its value); return the value kept."""
        ...


@runtime_checkable
class Leasing(Protocol):
    """Optional queries that let a fleet of supervisors share one store without each reading all of it
    (all three dispatch stores have them; a supervisor over a store without them lists every record).

    - :meth:`heartbeat`: the live members of a fleet, each one renewing its own membership; :meth:`leave`
      ends one at once (a supervisor that stops, so that the others take its share without waiting).
      A member's leases last as long as its membership: they are taken for long, and a heartbeat that
      finds a membership ended ends the leases of its holder (the etcd model: one keepalive for every
      key of a lease, not one renewal per key). So a member holding 100,000 records writes one row per
      heartbeat, not 100,000 every few seconds;
    - :meth:`held`: the revision of each record a supervisor leases (no record read), so that it reads
      again only those another process wrote, not all it holds; in pages, so that no single call of a
      supervisor holding 100,000 leases keeps it from the watch's changes for long;
    - :meth:`leasable`: the records a supervisor leases (or some of them) plus a bounded page of
      claimable ones (an indexed query by lease holder and expiry, not a listing of every record);
    - :meth:`renew_leases`: renew many leases in one call (one transaction), so a supervisor holding
      thousands of records keeps them without one round trip each.
    - :meth:`records`: the records of some job ids, in one call;
    - :meth:`counts`: the records in each state, counted by the store (the store-wide gauges).

    Expiry is judged by the store's clock, as for :meth:`Store.acquire_lease`.
    """

    async def heartbeat(
        self, group: str, holder: str, ttl: float, *, join: bool = False
    ) -> builtins.list[str]:
        """Renew ``holder``'s membership of ``group`` for ``ttl`` seconds — one that lapsed but was not
        yet ended counts — or, when it has none and ``join``, start one; end the memberships that
        lapsed; return the live members of ``group``, sorted. ``holder`` is among them only if it is a
        member now: a holder left out lost its membership, and with it its leases (see below).

        Ending a membership ends the leases of its holder once it is a member of no group (each gets
        the time of the end as its expiry, and a new revision): claimable at once. Starting one ends
        whatever its holder still leases from an earlier membership first. So a holder keeps its leases
        exactly as long as one membership, and a holder whose membership was ended must ``join`` again,
        knowing it holds nothing — a heartbeat never revives an ended membership by itself."""
        ...

    async def leave(self, group: str, holder: str) -> None:
        """End ``holder``'s membership of ``group`` now and, once it is a member of no group, give back
        every lease it holds, in one call (nothing to end: nothing happens)."""
        ...

    async def held(self, holder: str, *, after: str = "", limit: int | None = None) -> dict[str, int]:
        """The revision of every record whose lease names ``holder`` (live or lapsed) and whose job id
        sorts after ``after``, by job id, in job id order; at most ``limit`` of them (a page: the caller
        passes the last job id of one page as ``after`` for the next; ``None``: all)."""
        ...

    async def leasable(
        self,
        holder: str,
        *,
        states: Iterable[State],
        limit: int,
        after: str = "",
        held: Collection[str] | None = None,
    ) -> Listing:
        """Every record whose lease names ``holder`` (live or lapsed; only those of ``held``, when
        given), by job id, then at most ``limit`` records with no live lease, in one of ``states``,
        whose job id sorts after ``after``, by job id (a page: the caller passes the last job id of one
        page as ``after`` for the next)."""
        ...

    async def records(self, job_ids: Collection[str], *, states: Iterable[State] | None = None) -> Listing:
        """The records of ``job_ids`` that exist (only those in ``states``, when given), by job id: a
        fleet member's resync reads the few records it needs among thousands, not every record."""
        ...

    async def counts(self) -> dict[State, int]:
        """How many records there are in each state (a state with none left out): what a fleet member
        exports as the store-wide gauges, without reading every record."""
        ...

    async def renew_leases(
        self, holder: str, ttl: float, job_ids: Iterable[str], *, group: str | None = None
    ) -> builtins.list[JobRecord]:
        """Renew for ``ttl`` seconds the lease ``holder`` holds on each of ``job_ids``, live or lapsed
        but not taken by another holder, in one transaction; return the records renewed (a record
        another holder took, or gone, is left out). Each renewal is a write (it bumps the revision).
        With ``group``, only while ``holder`` is a member of it (as :meth:`member_lease`): else none."""
        ...

    async def member_lease(self, group: str, job_id: str, holder: str, ttl: float) -> JobRecord:
        """:meth:`Store.acquire_lease`, only while ``holder`` is a member of ``group`` (one that lapsed
        but was not yet ended counts), atomically with ending memberships: a member's lease, taken for
        long, can never outlive its membership — a take sent before the membership ended and arriving
        after it is refused, ``ConflictError``, rather than leave a lease that nothing would end."""
        ...


def check_leasing(group: object, holder: object, limit: object = 1) -> None:
    """``InvalidError`` for a group, holder or page size :class:`Leasing` does not accept."""
    for name, value in (("group", group), ("holder", holder)):
        if not isinstance(value, str) or not value or len(value) > 512 or "\x00" in value:
            raise InvalidError(
                "expected a non-empty string of at most 512 characters, without NUL", path=name
            )
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidError(f"expected a positive integer, got {limit!r}", path="limit")


def check_page(holder: object, after: object, limit: object) -> None:
    """``InvalidError`` for a page of :meth:`Leasing.held` that is not a holder, a job id to start
    after (a string: ``""`` for the first page) and a positive size or ``None``."""
    check_leasing("-", holder, 1 if limit is None else limit)
    if not isinstance(after, str) or "\x00" in after:
        raise InvalidError(f'expected a job id (or "" for the first page), got {after!r}', path="after")


STORE_ID_KEY = "dispatch/store-id"
"""The :class:`KeyValues` key under which a store keeps its identity."""


async def store_identity(store: Store) -> str:
    """The store's identity: a random id it keeps under :data:`STORE_ID_KEY`, made on first use (two
    processes opening a new store at once agree on one). Cluster objects carry it, so that two stores
    sharing a cluster leave each other's objects alone. ``""`` for a store without :class:`KeyValues`."""
    if not isinstance(store, KeyValues):
        return ""
    # Read first: a role that may only read the store (a dashboard) still learns an identity made earlier.
    known = await store.get_value(STORE_ID_KEY)
    if known is not None:
        return known
    import secrets  # deferred, as in new_job_id

    return await store.add_value(STORE_ID_KEY, f"s{secrets.token_hex(8)}")


MAX_VALUE = 1 << 20
"""The largest value :class:`KeyValues` keeps (characters)."""


def check_key_value(key: object, value: object) -> None:
    """``InvalidError`` for a key or value :class:`KeyValues` does not keep."""
    from dispatch.errors import InvalidError

    # NUL is refused because PostgreSQL's text cannot hold it: every store keeps the same values.
    if not isinstance(key, str) or not key or len(key) > 512 or "\x00" in key:
        raise InvalidError("expected a non-empty string of at most 512 characters, without NUL", path="key")
    if value is not None and (not isinstance(value, str) or len(value) > MAX_VALUE or "\x00" in value):
        raise InvalidError(
            f"expected a string of at most {MAX_VALUE} characters without NUL, or None", path="value"
        )
