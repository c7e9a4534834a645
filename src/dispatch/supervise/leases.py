"""Which records a supervisor looks after, and its leases on them: :class:`Leases` (a fleet member's share).

A record is acted on only under this supervisor's live lease (checked again by every record write).
Over a store with :class:`~dispatch.records.Leasing`, a supervisor that looks after every job without a
``capacity`` is a member of a fleet: it renews its membership in the store and leases only the jobs of
its :class:`~dispatch.model.Share` among the live members (the buckets that hash to it).

**A member's leases last as long as its membership** (the etcd model: one keepalive for all the keys of
a lease). It takes each for :data:`MEMBER_LEASE` times the lease duration and renews only its membership,
every quarter of the lease; the store ends the leases of a membership that lapsed, at the first heartbeat
of any member that finds it so (:meth:`Leasing.heartbeat`). By its own clock a member uses a lease only
while its membership is live too (:meth:`Leases.lease_until`): asked at ``t``, the membership ends in the
store no sooner than ``t`` plus the lease, so no other member can have taken a record while it acts on it,
whatever the two clocks read. A member whose membership the store ended learns it at its next heartbeat
(it is not among the members), forgets every lease and joins again. Before, each member renewed every
lease it held every half lease: at 100,000 records, 6,700 row writes a second and 40 % of its time.

What it keeps per leased job — the lease's expiry on its own clock, the record as last known, whether to
observe it before trusting it, the retry of a failed action — is dropped together when the lease goes
(:meth:`Leases.forget`).
"""

from __future__ import annotations

import heapq
import logging
import math
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass

from dispatch import decide, metrics
from dispatch.errors import ConflictError, DispatchError, NotFoundError
from dispatch.model import TERMINAL_STATES, JobRecord, Observation, Share, State
from dispatch.records import Leasing, Listing

from .decisions import live
from .ground import Ground

__all__ = ["CLAIMABLE", "CLAIM_BATCH", "HELD_BATCH", "MEMBER_LEASE", "RENEW_BATCH", "Leases", "Retry"]

log = logging.getLogger("dispatch.supervise")

MEMBER_LEASE = 120
"""How many times the lease duration a fleet member's lease on each record is taken for: its membership,
renewed every quarter of the lease, is what keeps it. This bounds a lease whose holder died when no
supervisor over the store is left to end its membership (an hour at the default 30 s lease; then nobody
acts on the record anyway, and the first supervisor to start ends it); each lease is renewed every half
hour, 55 row writes a second for 100,000 records, where renewing each every 15 s was 6,700."""

CLAIM_BATCH = 1000
"""Claimable records a fleet member reads per scan (a page; the next scan reads the next one)."""

RENEW_BATCH = 250
"""Leases a fleet member renews in one call (a member holding more renews them in several, folding the
watch's changes in between): on PostgreSQL, 1,000 in one statement took 100–340 ms, during which no
change was folded; 250 take a quarter of it, for no more work per lease."""

HELD_BATCH = 2000
"""Leases held whose revisions a fleet member's scan reads per call (:meth:`Leasing.held`'s pages,
folding the watch's changes in between): on PostgreSQL, all 100,000 in one query took 200–400 ms."""

CLAIMABLE = frozenset(State) - {State.SUCCEEDED, State.CANCELLED}
"""States of a record that may still need a supervisor (a failed or lost one may be requeued)."""


STRIDE = 512
"""Leases a pass over every lease held goes through between two folds of the watch's changes."""


def _job_id(rec: JobRecord) -> str:
    return rec.job_id


async def _nothing() -> None:
    return None


@dataclass
class Retry:
    """A failed action of a job: how many times in a row, and not to try again before when."""

    attempts: int
    not_before: float


class Leases:
    """The jobs one supervisor looks after and the leases it holds (see the module docstring). ``lease``,
    ``jobs``, ``exclude``, ``capacity`` and ``claim_batch`` are the supervisor's options."""

    def __init__(
        self,
        ground: Ground,
        *,
        lease: float,
        jobs: frozenset[str] | None,
        exclude: Collection[str],
        capacity: int | None,
        claim_batch: int,
        pause: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.ground = ground
        self.pause: Callable[[], Awaitable[None]] = pause if pause is not None else _nothing
        """What a long call of this part lets the supervisor do in its pauses (fold the watch's changes)."""
        self.lease = lease
        self.jobs = jobs
        self.exclude = exclude
        self.capacity = capacity
        self.claim_batch = claim_batch
        # The store's fleet calls when this supervisor is a fleet member: decided once, since a runtime
        # protocol check walks the protocol's members and the store never changes.
        self._leasing: Leasing | None = ground.store if isinstance(ground.store, Leasing) else None
        self.fleet = self._leasing if jobs is None and capacity is None else None
        self._members: tuple[str, ...] = ()  # the fleet's live members at the last scan (fleet mode)
        # A fleet member: how long it takes each lease for (its membership keeps them), whether it is a
        # member (its last heartbeat said so), and until when by its own clock (asked at + the lease).
        self.held_for = lease * MEMBER_LEASE if self.fleet is not None else lease
        self._joined = False
        self._member_until = -math.inf
        self.share: Share | None = None
        """This member's share of the jobs among ``_members`` (``None``: every job, as when alone)."""
        self._after = ""  # where the next page of claimable records starts
        self._next_keepalive = -math.inf  # when a fleet member next renews its membership and leases
        # job id -> our lease's expiry on our clock: the time we asked for it plus its duration, so a clock
        # that disagrees with the store's (which stamps the record's expiry) cannot make us act too long.
        self.until: dict[str, float] = {}
        self.fresh: set[str] = set()  # newly leased: observe before trusting the record
        # job id -> the record as our last write, lease change or read of it left it, for the records we
        # lease: a change folds from it without reading the store (stale only if another process wrote
        # meanwhile, which the compare-and-swap refuses).
        self.known: dict[str, JobRecord] = {}
        self.retry: dict[str, Retry] = {}
        # job id -> the revision of its record when the last work on it found nothing to do but wait
        # for the cluster (a plan that no time ends): until the record moves, a scan has nothing to do.
        self.quiet: dict[str, int] = {}

    def lease_until(self, jid: str) -> float | None:
        """Until when, by this supervisor's clock, its lease on ``jid`` may be used (``None``: not held): a
        fleet member's lasts no longer than its membership."""
        until = self.until.get(jid)
        if until is None or self.fleet is None:
            return until
        return min(until, self._member_until)

    def __contains__(self, jid: str) -> bool:
        """Whether this supervisor holds a lease on ``jid`` (as far as it knows)."""
        return jid in self.until

    @property
    def _group(self) -> str:
        """The fleet this supervisor is a member of: the supervisors of its cluster over its store."""
        return f"{self.ground.backend.name}/{self.ground.backend.cluster_id}"

    def mine(self, job_id: str) -> bool:
        """Whether this supervisor looks after ``job_id`` at all (``jobs``, ``exclude``)."""
        return (self.jobs is None or job_id in self.jobs) and job_id not in self.exclude

    def concerns(self, jid: str) -> bool:
        """Whether a change of job ``jid`` is this supervisor's to fold: one of its jobs that it leases
        or that hashes to it. Another member's is skipped (that member folds it, or observes the job
        afresh when it takes over)."""
        return self.mine(jid) and (jid in self.until or self.assigned(jid))

    def ours(self, rec: JobRecord) -> bool:
        """Whether this supervisor looks after ``rec``: one of its jobs, on its own cluster (SPEC §6.1)."""
        return self.mine(rec.job_id) and decide.owned(
            rec, self.ground.backend.cluster_id, self.ground.backend.name
        )

    async def own(self, rec: JobRecord) -> JobRecord | None:
        """``rec`` under our live lease (taken or renewed as needed), or ``None`` if it is not ours."""
        jid = rec.job_id
        if not self.ours(rec):
            return None
        now = self.ground.clock.now()
        if self.fleet is not None and self._member_until <= now:
            # Not a member by its own clock (a long pause, a failed heartbeat): a heartbeat first, and
            # no lease is its to use or take until one says it is a member.
            await self.keepalive(renew=False)
            now = self.ground.clock.now()
            if self._member_until <= now:
                return None
        lease = rec.lease
        ours = lease is not None and lease.holder == self.ground.holder and self.until.get(jid, now) > now
        # A fleet member's leases are renewed together (keepalive, at half): one alone only when late.
        renew_at = self.held_for / 4 if self.fleet is not None else self.held_for / 2
        if ours and self.until[jid] - now > renew_at:
            return rec
        if lease is not None and lease.holder != self.ground.holder and lease.live(now):
            self.forget(jid)
            return None
        if jid not in self.until and self.capacity is not None and len(self.until) >= self.capacity:
            return None
        if jid not in self.until and not self.assigned(jid):
            return None  # another live member's share: it takes the lease
        try:
            if self.fleet is not None:  # a lease that lasts as long as the membership: taken only in one
                got = await self.fleet.member_lease(self._group, jid, self.ground.holder, self.held_for)
            else:
                got = await self.ground.store.acquire_lease(jid, self.ground.holder, self.held_for)
        except (ConflictError, NotFoundError):
            self.forget(jid)
            return None
        assert got.lease is not None
        if lease is not None and lease.holder != self.ground.holder:  # expired: a dead supervisor's record
            metrics.current().inc("dispatch_leases_taken_over_total")
        if not ours:
            self.fresh.add(jid)  # events may have been someone else's until now: observe before trusting
        self._leased(jid, now)
        self.known[jid] = got
        return got

    def _leased(self, jid: str, now: float) -> None:
        """Our lease on ``jid`` was taken or renewed, asked at ``now``: the store's lease ends no sooner
        than ``now`` plus its duration. Moved to the end of ``until``, which so stays in the order the
        leases end (each lasts ``held_for`` from when it was asked), as long as the clock does not go back."""
        self.until.pop(jid, None)
        self.until[jid] = now + self.held_for

    def assigned(self, jid: str) -> bool:
        """Whether ``jid`` is in this supervisor's share among the fleet's live members (always, alone)."""
        return self.share is None or self.share.holds(jid)

    def newest(self, rec: JobRecord) -> JobRecord:
        """``rec`` or, if newer, the copy of it our last write or lease change left (a scan's records
        are read before the renewals made during the scan, which move their revision: a write from
        the listed copy would only be refused by the compare-and-swap); the newer one is kept."""
        known = self.known.get(rec.job_id)
        if known is not None and known.revision > rec.revision:
            return known
        if rec.job_id in self.until:
            self.known[rec.job_id] = rec
        return rec

    def remember(self, rec: JobRecord) -> None:
        """``rec`` as our last write left it, kept if we lease it."""
        if rec.job_id in self.until:
            self.known[rec.job_id] = rec

    def lost(self, jid: str) -> None:
        """A write found our lease on ``jid`` gone."""
        if jid in self.until:
            metrics.current().inc("dispatch_leases_lost_total")
        self.forget(jid)

    def forget(self, jid: str) -> None:
        self.until.pop(jid, None)
        self.known.pop(jid, None)
        self.fresh.discard(jid)
        self.retry.pop(jid, None)
        self.quiet.pop(jid, None)

    def names_us(self, rec: JobRecord) -> bool:
        """Whether the store's copy ``rec`` names this supervisor the lease holder — known to it or not
        (a take whose answer was lost leaves a lease it does not know it holds)."""
        return rec.lease is not None and rec.lease.holder == self.ground.holder

    async def let_go(self, jid: str, rec: JobRecord | None = None) -> None:
        """The record is final, or another member's now: give its lease back — also one ``rec``, as read
        from the store, says we hold without our knowing (a fleet member's would outlive the take by as
        long as its membership, keeping the record from its owner)."""
        if jid in self.until or (rec is not None and self.names_us(rec)):
            try:
                await self.ground.store.release_lease(jid, self.ground.holder)
            except DispatchError:
                pass
        self.forget(jid)

    async def release_all(self) -> None:
        """Leave the fleet, and release every lease held (another supervisor may take them at once: its
        next heartbeat no longer counts this member, so this member's share is its to take). Leaving
        gives back a member's leases in the same call."""
        if self.fleet is not None and self._joined:
            try:
                await self.fleet.leave(self._group, self.ground.holder)
                self._joined, self._member_until = False, -math.inf
                self.until.clear()
            except DispatchError as exc:
                log.info("fleet membership not ended (it expires by itself): %s", exc)
        for jid in sorted(self.until):
            try:
                await self.ground.store.release_lease(jid, self.ground.holder)
            except DispatchError as exc:
                log.info("lease on %s not released: %s", jid, exc)
        self.until.clear()
        self.known.clear()
        self.quiet.clear()

    async def keepalive(self, *, due: bool = False, renew: bool = True) -> None:
        """A fleet member renews its membership and (``renew``) the leases that are half gone: at each
        scan, and between changes when a long step would otherwise let them lapse under load. Another
        supervisor over a store with :class:`Leasing` (``dispatch run``'s, one with a ``capacity``) ends
        the memberships that lapsed, so that a dead member's leases end for it too, not only when
        another member's heartbeat comes."""
        store = self._leasing  # a member's, or (not a member) only to end the memberships that lapsed
        if store is None or (not due and self.ground.clock.now() < self._next_keepalive):
            return
        now = self.ground.clock.now()
        self._next_keepalive = now + self.lease / 4  # not every poll: a poll of 0 would renew per record
        try:
            holder = self.ground.holder
            if self.fleet is None:
                await store.heartbeat(self._group, holder, self.lease)  # not a member: it only ends
                return
            members = await store.heartbeat(self._group, holder, self.lease, join=not self._joined)
            if holder not in members:
                # Our membership was ended (a heartbeat came later than the lease), and our leases
                # with it: forget them all, and join again.
                if self._joined:
                    log.warning(
                        "fleet membership of %s ended; its %d leases ended with it", holder, len(self.until)
                    )
                    for jid in list(self.until):
                        self.lost(jid)
                self._joined, self._member_until = False, -math.inf
                now = self.ground.clock.now()
                members = await store.heartbeat(self._group, holder, self.lease, join=True)
            self._joined, self._member_until = True, now + self.lease
            now_members = tuple(sorted({*members, holder}))
            if now_members != self._members:
                # The shares moved: what this member now owns (a dead member's records, ones another
                # member handed over) may lie anywhere in the claimable pages, so they start over.
                self._members, self._after = now_members, ""
                alone = len(now_members) < 2
                self.share = None if alone else Share.of(self.ground.holder, now_members)
            if not renew:
                return
            # The soonest to end first: ``until`` is in that order already (see ``_leased``), so the
            # due ones are its head — a pass over 100,000 leases at every keepalive stalled the loop.
            due_ids: list[str] = []
            half = self.held_for / 2
            for jid, until in self.until.items():
                if until - now > half:
                    break
                due_ids.append(jid)
            for i in range(0, len(due_ids), RENEW_BATCH):
                if i:
                    await self.pause()  # thousands of leases: the watch's changes are not held up
                now = self.ground.clock.now()
                for rec in await store.renew_leases(
                    self.ground.holder, self.held_for, due_ids[i : i + RENEW_BATCH], group=self._group
                ):
                    if rec.job_id in self.until:  # not let go meanwhile
                        self._leased(rec.job_id, now)
                        self.known[rec.job_id] = rec
        except DispatchError as exc:
            if due:  # the scan reports it
                raise
            metrics.current().inc("dispatch_store_errors_total")
            log.info("fleet keepalive failed, tried again within a poll: %s", exc)

    async def resync_records(self, listing: Iterable[Observation]) -> dict[str, JobRecord]:
        """The records a fleet member's resync needs for ``listing``, by job id: those it leases, as it
        knows them, and — read in batches — the finished ones of its share whose incarnation may still
        have compute (leftovers to stop: nobody leases a finished record). A record of its share that
        is not finished and that it does not lease is another member's, or claimable: the scans lease
        it and observe it afresh. Not every record of the store, as a supervisor alone reads it."""
        store = self.fleet
        assert store is not None  # called only for a fleet member
        out: dict[str, JobRecord] = {}
        for i, (jid, rec) in enumerate(list(self.known.items())):  # 100,000: fold changes meanwhile
            if i % STRIDE == STRIDE - 1:
                await self.pause()
            if jid in self.until:
                out[jid] = rec
        wanted: set[str] = set()
        for i, obs in enumerate(listing):
            if i % STRIDE == STRIDE - 1:
                await self.pause()
            if (jid := obs.handle.identity.job_id) not in out and self.concerns(jid) and live(obs):
                wanted.add(jid)
        ids = sorted(wanted)
        for i in range(0, len(ids), RENEW_BATCH):
            if i:
                await self.pause()
            found = await store.records(ids[i : i + RENEW_BATCH], states=TERMINAL_STATES)
            out.update((rec.job_id, rec) for rec in found)
        return out

    async def fleet_records(self) -> Listing:
        """A fleet member's scan: heartbeat, renew the leases due, then what it leases — read again only
        where the store's revision is not the one it knows (another process wrote it), else as it knows
        it — and a page of claimable records."""
        store = self.fleet
        assert store is not None  # called only for a fleet member
        holder = self.ground.holder
        await self.keepalive(due=True)
        leased = list(self.until)  # before the first page: each of these was taken before it was read
        revisions: dict[str, int] = {}
        after = ""
        while True:  # in pages, by job id: one query for 100,000 leases held the watch's changes up
            page = await store.held(holder, after=after, limit=HELD_BATCH)
            revisions.update(page)
            if len(page) < HELD_BATCH:
                break
            after = next(reversed(page))
            await self.pause()
        # Passes over every lease held (100,000 at most): the watch's changes are folded every STRIDE
        # of them, as between the records of the scan, instead of waiting for the whole pass. A lease
        # taken since the first page was asked for is not in ``leased``: its page may predate it.
        for i, jid in enumerate(leased):
            if i % STRIDE == STRIDE - 1:
                await self.pause()
            if jid not in revisions:  # taken over or purged meanwhile
                self.forget(jid)
        kept: list[JobRecord] = []
        moved: list[str] = []
        for i, (jid, revision) in enumerate(revisions.items()):
            if i % STRIDE == STRIDE - 1:
                await self.pause()
            known = self.known.get(jid)
            # Newer than the store's revision read: our own write since (a change folded in a pause).
            if known is not None and known.revision >= revision:
                kept.append(known)
            else:
                moved.append(jid)
        read = await store.leasable(
            holder, states=CLAIMABLE, limit=self.claim_batch, after=self._after, held=moved
        )
        mine = [r for r in read if r.lease is not None and r.lease.holder == holder]
        free = len(read) - len(mine)
        self._after = read[-1].job_id if free >= self.claim_batch else ""
        # Two runs in job id order: merged (most scans read nothing again: ``kept`` is all of it).
        held = list(heapq.merge(kept, mine, key=_job_id)) if mine else kept
        return Listing([*held, *read[len(mine) :]], read.unreadable)

    def idle(self, rec: JobRecord) -> bool:
        """Whether a fleet member's scan may pass ``rec`` by: leased, its own, and as it was when its
        last scan found nothing to do but wait for the cluster (:attr:`quiet`); its lease is renewed
        by :meth:`keepalive`, and a change of it comes by the watch."""
        jid = rec.job_id
        return (
            self.fleet is not None
            and self.quiet.get(jid) == rec.revision
            and jid in self.until
            and jid not in self.fresh
            and jid not in self.retry
            and self.assigned(jid)
        )
