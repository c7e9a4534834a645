"""The supervisor: fold what the cluster reports into records, decide the next action, perform it.

One :class:`Supervisor` works through the backend protocols alone (any adapter) and a
:class:`~dispatch.records.Store`. Each :meth:`Supervisor.step`:

1. **observes** — drains the backend's :class:`~dispatch.backend.Watcher` from the saved cursor
   (without waiting), or, on a backend without one, observes every leased record's incarnation; every
   ``resync`` seconds it also lists the cluster (``Backend.list``) to reconcile what a watch may miss,
   find objects of ours that match no record (:class:`UnmatchedPolicy`) and stop incarnations no record
   wants any more;
2. **leases** — takes (or renews) a time-bounded lease on every record that is not final and not leased
   by a live other supervisor; a record is acted on only under our live lease, checked again in every
   record write, so several supervisors over one store never act on one record, and the records of one
   that died are taken over once its leases expire;
3. **decides and acts** — for each leased record, :func:`dispatch.decide.next` gives the one action,
   which is performed through the backend and recorded with a compare-and-swap; then the next action,
   until the record waits on the cluster or on time. Nothing blocks: a previous incarnation whose pods
   linger is re-checked at a later step.

Requeue is: record "requeue to N+1" (one write, naming the policy rule) → ``stop`` the old incarnation →
wait until its compute is gone (``CessationSignal``; else until it is observed gone) → record that →
after the rule's backoff, ``prepare`` + ``start`` the new identity → record the handle. A crash between
any two of these is recovered from the record plus the cluster: ``start`` is idempotent per identity, a
``stop`` is idempotent, and a write whose effect is unknown is written into the record
(``unknown_write``) and settled by looking the identity up on the cluster before anything else.
:meth:`Supervisor.run` loops :meth:`step` until stopped (the daemon and ``dispatch run``).
"""

from __future__ import annotations

import asyncio
import builtins
import hashlib
import logging
import math
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dispatch import chance, decide, health, metrics
from dispatch.backend import Backend, Watcher, compute_gone, record_decision
from dispatch.clock import Clock, SystemClock
from dispatch.errors import (
    ConflictError,
    DispatchError,
    InvalidError,
    NotFoundError,
    OutcomeUnknownError,
    UnavailableError,
    UnsupportedError,
)
from dispatch.fold import fold, matches
from dispatch.model import (
    DEFAULT_POLICY,
    Absent,
    Actor,
    Capabilities,
    Cause,
    Change,
    Compute,
    Handle,
    JobRecord,
    JobSpec,
    Observation,
    Outcome,
    Plan,
    PlanAction,
    Policy,
    State,
    Transition,
    Unreachable,
)
from dispatch.reader import Reader
from dispatch.records import Leasing, Listing, Store, Unreadable
from dispatch.tally import oldest, tally
from dispatch.writer import LeaseLostError, RecordWriter

__all__ = ["LeaseLostError", "StepReport", "Supervisor", "UnmatchedPolicy"]

log = logging.getLogger("dispatch.supervise")

MAX_ACTIONS = 8
"""Actions taken for one record in one step before moving on (a requeue is four or five)."""

CLAIM_BATCH = 1000
"""Claimable records a fleet member reads per scan (a page; the next scan reads the next one)."""

RESYNC_JITTER = 0.9
"""The shortest interval between two resyncs, as a fraction of ``resync`` (see ``Supervisor.step``)."""

OWNED_CACHE = 100_000
"""How many job ids' fleet assignment a member keeps at most (see ``Supervisor._assigned``)."""

CLAIMABLE = frozenset(State) - {State.SUCCEEDED, State.CANCELLED}
"""States of a record that may still need a supervisor (a failed or lost one may be requeued)."""

ADOPTED_COMMAND = ("dispatch-adopted",)
"""The command of a record adopted from a cluster object: its real spec is not known to dispatch."""


class UnmatchedPolicy(StrEnum):
    """What to do with a cluster object that carries dispatch's identity but matches no record."""

    IGNORE = "ignore"  # leave it alone (default): it may belong to another store
    ADOPT = "adopt"  # create a record for it (its spec unknown: it is never requeued)
    DELETE = "delete"  # stop it


@dataclass
class StepReport:
    """What one :meth:`Supervisor.step` did (for logs, tests and the simulation's traces)."""

    changes: int = 0
    folded: int = 0
    actions: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    leased: int = 0
    unreadable: list[str] = field(default_factory=list)
    """Stored records it could not read (each named once per supervisor): left alone, never an error of
    the step's actions."""


@dataclass
class _Retry:
    attempts: int
    not_before: float


class Supervisor:
    """Supervises the records of one store on one backend. See the module docstring.

    ``policy`` applies to records without their own; ``holder`` names this supervisor in leases
    (default: host, pid and a random suffix); ``lease`` is the lease duration and ``poll`` the interval
    between polls (and between checks of lingering compute), in seconds of ``clock``; ``resync`` how often
    the whole cluster is listed; ``jobs`` restricts it to some job ids (``dispatch run``), ``exclude``
    leaves some alone (records of a cluster that is gone: the CLI's stopped dev cluster); ``capacity``
    caps how many records it leases at once.

    **A fleet.** Over a store with :class:`~dispatch.records.Leasing` (all three dispatch stores), a
    supervisor that looks after every job, without a ``capacity``, is a member of a fleet: at each scan it renews its membership
    (a heartbeat in the store, for ``lease`` seconds), and it leases only the jobs whose id hashes to it
    among the live members (rendezvous hashing), so N members split the work evenly and a member that
    dies has its share spread over the others once its membership and leases expire. A scan reads the
    records it leases plus a page of ``claim_batch`` claimable ones (not every record); its leases are
    renewed in one call; a change on a record hashed to another member is left to that member without
    reading the store. A record is still acted on only under our live lease, with compare-and-swap: the
    hash decides who tries, the lease who may.
    """

    def __init__(
        self,
        backend: Backend,
        store: Store,
        *,
        policy: Policy = DEFAULT_POLICY,
        clock: Clock | None = None,
        holder: str | None = None,
        lease: float = 30.0,
        poll: float = 2.0,
        resync: float = 60.0,
        unmatched: UnmatchedPolicy | str = UnmatchedPolicy.IGNORE,
        jobs: Collection[str] | None = None,
        capacity: int | None = None,
        exclude: Collection[str] = (),
        claim_batch: int = CLAIM_BATCH,
        rng: random.Random | None = None,
    ) -> None:
        if not isinstance(policy, Policy):
            raise InvalidError(f"expected a Policy, got {type(policy).__name__}", path="policy")
        for name, value in (("lease", lease), ("poll", poll), ("resync", resync)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise InvalidError(f"expected a finite number of seconds, got {value!r}", path=name)
        if lease <= 0 or poll < 0 or resync < 0:
            raise InvalidError("need lease > 0, poll >= 0 and resync >= 0 (seconds)", path="lease")
        if poll * 2 >= lease:
            raise InvalidError(
                f"the lease ({lease:g} s) must outlast two polls ({poll:g} s each) to be renewed in time",
                path="lease",
            )
        try:
            self.unmatched = UnmatchedPolicy(unmatched)
        except ValueError:
            allowed = ", ".join(u.value for u in UnmatchedPolicy)
            raise InvalidError(f"expected one of {allowed}, got {unmatched!r}", path="unmatched") from None
        for name, ids in (("jobs", jobs), ("exclude", exclude)):
            if ids is not None and (isinstance(ids, str) or not all(isinstance(j, str) for j in ids)):
                raise InvalidError(f"expected a collection of job ids, got {ids!r}", path=name)
        if capacity is not None and (
            isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1
        ):
            raise InvalidError(f"expected a positive integer, got {capacity!r}", path="capacity")
        if isinstance(claim_batch, bool) or not isinstance(claim_batch, int) or claim_batch < 1:
            raise InvalidError(f"expected a positive integer, got {claim_batch!r}", path="claim_batch")
        self.backend = backend
        self.store = store
        self.policy = policy
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.rng = chance.source(rng)
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{chance.token(self.rng, 3)}"
        self.lease = float(lease)
        self.poll = float(poll)
        self.resync = float(resync)
        self.jobs = frozenset(jobs) if jobs is not None else None
        self.exclude = frozenset(exclude)
        self.capacity = capacity
        self.claim_batch = claim_batch
        # The store's fleet calls when this supervisor is a fleet member (see the class docstring): decided
        # once, since a runtime protocol check walks the protocol's members and the store never changes.
        self._fleet: Leasing | None = (
            store if isinstance(store, Leasing) and self.jobs is None and capacity is None else None
        )
        self._members: tuple[str, ...] = ()  # the fleet's live members at the last scan (fleet mode)
        # job id -> whether it hashes to us among ``_members``: asked for every watch change of every
        # member, so computed once per job while the membership stands (cleared when it changes).
        self._owned: dict[str, bool] = {}
        self._after = ""  # where the next page of claimable records starts
        self._next_keepalive = -math.inf  # when a fleet member next renews its membership and leases
        self.cursor: str | None = None
        """The watch cursor: where the next drain resumes (``None``: relist)."""
        # job id -> our lease's expiry on our clock: the time we asked for it plus its duration, so a clock
        # that disagrees with the store's (which stamps the record's expiry) cannot make us act too long.
        self._leased: dict[str, float] = {}
        self._fresh: set[str] = set()  # newly leased: observe before trusting the record
        # job id -> the record as our last write, lease change or read of it left it, for the records we
        # lease: a change folds from it without reading the store (stale only if another process wrote
        # meanwhile, which the compare-and-swap refuses; see _fold_change).
        self._known: dict[str, JobRecord] = {}
        self._retry: dict[str, _Retry] = {}
        self._stopped: dict[str, float] = {}  # native ref -> when we asked it to stop
        self._feed: WatchFeed | None = None
        self._next_scan = -math.inf
        self._next_resync = -math.inf
        self._listing: builtins.list[Observation] | None = None
        self._index: tuple[builtins.list[Observation], dict[tuple[str, int, str], Observation]] | None = None
        self._capabilities: Capabilities | None = None
        self._unreadable: set[str] = set()  # job ids of unreadable records already reported
        self._reader = Reader(backend, self.clock)
        self._writer = RecordWriter(
            store,
            backend,
            self.clock,
            holder=self.holder,
            lease_until=self._leased.get,
            on_write=self._written,
        )
        self._closed = False
        self._starting: dict[tuple[str, int], float] = {}  # incarnation -> first seen starting

    def __repr__(self) -> str:
        return (
            f"Supervisor(holder={self.holder!r}, backend={self.backend.name!r}, leased={len(self._leased)})"
        )

    def _mine(self, job_id: str) -> bool:
        """Whether this supervisor looks after ``job_id`` at all (``jobs``, ``exclude``)."""
        return (self.jobs is None or job_id in self.jobs) and job_id not in self.exclude

    def _concerns(self, jid: str) -> bool:
        """Whether a change of job ``jid`` is this supervisor's to fold: one of its jobs that it leases
        or that hashes to it. Another member's is skipped (that member folds it, or observes the job
        afresh when it takes over)."""
        return self._mine(jid) and (jid in self._leased or self._assigned(jid))

    def _wanted(self, change: Change) -> bool:
        """:meth:`_concerns` for a watch change. A fleet member's watch delivers every member's changes;
        the kept watch buffers, and wakes the loop for, only these."""
        return self._concerns(change.handle.identity.job_id)

    def _ours(self, rec: JobRecord) -> bool:
        """Whether this supervisor looks after ``rec``: one of its jobs, on its own cluster (SPEC §6.1)."""
        return self._mine(rec.job_id) and self._writer.owns(rec)

    @property
    def leased(self) -> frozenset[str]:
        """The job ids this supervisor holds a lease on (as far as it knows)."""
        return frozenset(self._leased)

    # ------------------------------------------------------------------ the loop

    async def step(self) -> StepReport:
        """One pass: observe, lease, decide and act. Never waits on the cluster."""
        report = StepReport()
        self._listing = None
        now = self.clock.now()
        touched: dict[str, JobRecord] = {}  # job id -> its record as the last fold left it
        watching = await self._watching()
        if watching:
            if self._feed is not None:
                changes = self._feed.take()
                self.cursor = self._feed.cursor
            else:
                changes = await self._drain()
            report.changes = len(changes)
            # Level, not edge: only the newest reading of each incarnation is folded (what the watch
            # delivered in between says nothing the newest does not, and a fold is a store write).
            latest: dict[str, Change] = {}
            for change in changes:
                latest.pop(change.handle.ref, None)
                latest[change.handle.ref] = change
            for change in latest.values():
                jid = change.handle.identity.job_id
                try:
                    await self._keepalive()
                    folded = await self._fold_change(jid, change.reading, confirmed=False, report=report)
                    if folded is not None:
                        touched[jid] = folded
                        metrics.current().observe(
                            "dispatch_event_record_lag_seconds",
                            max(0.0, self.clock.now() - change.reading.at),
                        )
                except DispatchError as exc:  # this change is seen again at the next resync
                    report.errors.append(f"{jid}: {type(exc).__name__}: {exc}")
        if now >= self._next_resync:
            # 90-100 % of the interval, drawn each time (controller-runtime jitters its SyncPeriod the
            # same way): members started together do not list the store and the cluster all at once.
            self._next_resync = now + self.resync * self.rng.uniform(RESYNC_JITTER, 1.0)
            await self._reconcile(report)
        if now >= self._next_scan:
            self._next_scan = now + self.poll
            await self._scan(report, poll=not watching)
            touched.clear()  # the scan worked on every record
        for jid in sorted(touched):
            await self._keepalive()
            await self._work(jid, report, rec=touched[jid])
        report.leased = len(self._leased)
        return report

    async def run(
        self,
        *,
        stop: asyncio.Event | None = None,
        until: Callable[[], Awaitable[bool]] | None = None,
        on_step: Callable[[StepReport], Awaitable[None]] | None = None,
    ) -> None:
        """Step until ``stop`` is set or ``until()`` is true, waiting between steps for a change from
        the watch or the poll interval. A step in hand is always finished; the leases are released at
        the end (:meth:`close`)."""
        stop = stop if stop is not None else asyncio.Event()
        # The probes (/healthz, /readyz): the loop turns at least every poll; the store answers every
        # scan; the cluster at every resync (a quiet watch delivers nothing in between).
        probes = health.current()
        probes.expect(health.LIVENESS, max(60.0, 10 * self.poll))
        probes.expect("store", max(60.0, 10 * self.poll))
        probes.expect("cluster", max(120.0, 3 * self.resync))
        try:
            if await self._watching():
                self.keep_watching()
            while not stop.is_set():
                started = time.monotonic()
                try:
                    report = await self.step()
                except DispatchError as exc:  # the store or cluster went away: try again after a poll
                    log.warning("supervisor step failed: %s", exc)
                    report = StepReport(errors=[str(exc)])
                recorder = metrics.current()
                recorder.observe("dispatch_supervisor_step_duration_seconds", time.monotonic() - started)
                recorder.set("dispatch_leases_held", len(self._leased))
                health.current().mark(health.LIVENESS)
                if on_step is not None:
                    await on_step(report)
                if until is not None and await until():
                    return
                await self._idle(stop)
        finally:
            await self.close()

    async def _idle(self, stop: asyncio.Event) -> None:
        """Wait for the next thing to do: a watch change, the next poll, or ``stop``."""
        delay = max(0.0, min(self._next_scan, self._next_resync) - self.clock.now())
        if delay <= 0:
            await asyncio.sleep(0)
            return
        stopper = asyncio.ensure_future(stop.wait())
        waiters: set[asyncio.Future[Any]] = {stopper, asyncio.ensure_future(self.clock.sleep(delay))}
        if self._feed is not None:
            waiters.add(asyncio.ensure_future(self._feed.wait()))
        try:
            await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
            await asyncio.gather(*waiters, return_exceptions=True)

    def keep_watching(self) -> None:
        """Keep one watch open from now on (:meth:`run` does this): every step then takes the changes it
        delivered meanwhile, instead of reading a fresh watch from the cursor. On Kubeflow a fresh watch
        lists every kind again, so a daemon must keep one open; ``step`` alone reads a fresh one, which an
        in-process backend answers at once. Needs a running event loop; :meth:`close` ends it."""
        if self._feed is None:
            if not isinstance(self.backend, Watcher):
                raise UnsupportedError(f"backend {self.backend.name!r} has no watch to keep open")
            self._feed = WatchFeed(self.backend, self.cursor, self.clock, keep=self._wanted)

    async def close(self) -> None:
        """Release every lease this supervisor holds (another one may take them at once). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._feed is not None:
            await self._feed.close()
            self._feed = None
        for jid in sorted(self._leased):
            try:
                await self.store.release_lease(jid, self.holder)
            except DispatchError as exc:
                log.info("lease on %s not released: %s", jid, exc)
        self._leased.clear()
        self._known.clear()

    # ------------------------------------------------------------------ observing

    async def _caps(self) -> Capabilities:
        # Capabilities are per opened cluster: read once.
        if self._capabilities is None:
            self._capabilities = await self.backend.capabilities()
        return self._capabilities

    async def _watching(self) -> bool:
        return isinstance(self.backend, Watcher) and (await self._caps()).watch

    async def _drain(self) -> builtins.list[Change]:
        """Every change the watch has now, from the saved cursor; stops at the first wait."""
        assert isinstance(self.backend, Watcher)
        out: builtins.list[Change] = []
        changes = self.backend.watch(self.cursor)
        try:
            while True:
                try:
                    async with asyncio.timeout(0):
                        change = await anext(changes)
                except (TimeoutError, StopAsyncIteration):
                    break
                out.append(change)
                self.cursor = change.cursor
        except DispatchError as exc:  # a dropped watch: resume from the cursor next time
            log.info("watch interrupted: %s", exc)
        finally:
            await _aclose(changes)
        return out

    async def _list(self) -> builtins.list[Observation]:
        if self._listing is None:
            self._listing = await self.backend.list()
            health.current().mark("cluster")
        return self._listing

    async def _reconcile(self, report: StepReport) -> None:
        """List the cluster: fold what the watch may have missed, handle unmatched objects, and stop
        incarnations that no record wants."""
        try:
            listing = await self._list()
        except DispatchError as exc:
            report.errors.append(f"list: {exc}")
            self._next_resync = self.clock.now()  # try again next step
            return
        try:
            listed_records = await self.store.list()
        except DispatchError:
            metrics.current().inc("dispatch_store_errors_total")
            raise
        health.current().mark("store")
        known = {r.job_id: r for r in listed_records}
        if self._fleet is not None:
            self._gauges(listed_records, self.clock.now())
        listed = {(o.handle.identity.job_id, o.handle.identity.epoch.n) for o in listing}
        for rec in known.values():
            # An incarnation of ours missing from the listing may be gone: observe it before trusting
            # the record (the watch event that said so may have gone to another supervisor).
            handle = decide.current_handle(rec)
            mine = handle is not None and not rec.outcome.terminal and rec.job_id in self._leased
            if mine and (rec.job_id, rec.epoch.n) not in listed:
                self._fresh.add(rec.job_id)
        for obs in listing:
            try:
                await self._reconcile_one(obs, known, report)
            except DispatchError as exc:
                report.errors.append(f"{obs.handle.identity}: {type(exc).__name__}: {exc}")

    async def _reconcile_one(self, obs: Observation, known: dict[str, JobRecord], report: StepReport) -> None:
        ident = obs.handle.identity
        if not self._mine(ident.job_id):
            return
        rec = known.get(ident.job_id)
        if rec is None:
            await self._unmatched(obs, report)
            return
        if not self._writer.owns(rec):
            return  # another cluster's record: its own cluster's processes look after it
        if matches(rec, obs) and not rec.outcome.terminal:
            await self._fold_change(ident.job_id, obs, confirmed=False, report=report)
        elif _live(obs) and self._unwanted(rec, obs):
            got = await self._own(rec)
            if got is not None and self._unwanted(got, obs):
                await self._stop_unwanted(got, obs, report)

    @staticmethod
    def _unwanted(rec: JobRecord, obs: Observation) -> bool:
        """An incarnation its record no longer wants: of a finished record's current epoch, or of an
        epoch that is neither the record's nor the previous one it is retiring (an object of another
        record of the same job id is no business of this one's)."""
        ident = obs.handle.identity
        if ident.nonce != rec.nonce:
            return False
        n = ident.epoch.n
        if n == rec.epoch.n:
            return rec.outcome.terminal
        prev = decide.previous_handle(rec)
        return n < rec.epoch.n and (prev is None or prev.identity.epoch.n != n)

    async def _stop_unwanted(self, rec: JobRecord, obs: Observation, report: StepReport) -> None:
        """Stop compute no record wants; a finished record's own incarnation's leftovers (a terminal
        record never sits over live compute) are named in its history."""
        ident = obs.handle.identity
        if ident.epoch.n != rec.epoch.n:
            await self._stop(obs.handle, report, why=f"no record wants {ident}")
            return
        # Read again before stopping anything of a finished job: a listing may lag (compute it shows
        # may be gone by now), and a stop deletes the incarnation's objects.
        again = await self._reader.observe(obs.handle)
        if not isinstance(again, Observation) or again.compute is not Compute.PRESENT:
            return
        obs = again
        stopped = await self._stop(
            obs.handle, report, why=f"{ident} ended {rec.outcome} but its compute remains"
        )
        if stopped:
            why = f"{ident} ended {rec.outcome} and its compute was still there ({obs.outcome}): stopped it"
            now = self.clock.now()
            await self._update(
                rec.job_id,
                lambda r: (
                    (
                        r,
                        [
                            Transition(
                                at=now,
                                actor=Actor.SUPERVISOR,
                                what="stopped leftovers",
                                why=why,
                                epoch=r.epoch,
                            )
                        ],
                    )
                    if r.epoch.n == ident.epoch.n
                    else None
                ),
            )

    async def _unmatched(self, obs: Observation, report: StepReport) -> None:
        ident = obs.handle.identity
        if self.unmatched is UnmatchedPolicy.IGNORE:
            return
        if self.unmatched is UnmatchedPolicy.DELETE:
            if not obs.outcome.terminal:
                await self._stop(obs.handle, report, why=f"{ident} matches no record (unmatched: delete)")
            return
        now = self.clock.now()
        rec = JobRecord(
            job_id=ident.job_id,
            spec=JobSpec(command=ADOPTED_COMMAND),
            created_at=now,
            updated_at=now,
            policy=Policy(),  # its spec is unknown here: never requeued, only followed
            epoch=ident.epoch,
            handle=obs.handle,
            cluster=self.backend.cluster_id,
            # "cancelled" means we cancelled it; we did not (fold's rule).
            outcome=obs.outcome
            if obs.state is not State.CANCELLED
            else Outcome(State.FAILED, Cause.CANCELLED, obs.outcome.evidence),
        )
        first = Transition(
            at=now,
            actor=Actor.SUPERVISOR,
            what="adopted",
            why=f"{obs.handle} carries dispatch's identity and matched no record; its spec is unknown",
            state=obs.state,
            cause=obs.cause,
            epoch=ident.epoch,
        )
        try:
            await self.store.create(rec, first)
            report.actions.append(f"{ident.job_id}: adopted {obs.handle}")
        except ConflictError:
            pass  # another supervisor adopted it first

    # ------------------------------------------------------------------ leases

    async def _own(self, rec: JobRecord) -> JobRecord | None:
        """``rec`` under our live lease (taken or renewed as needed), or ``None`` if it is not ours."""
        jid = rec.job_id
        if not self._ours(rec):
            return None
        now = self.clock.now()
        lease = rec.lease
        ours = lease is not None and lease.holder == self.holder and self._leased.get(jid, now) > now
        if ours and self._leased[jid] - now > self.lease / 2:
            return rec
        if lease is not None and lease.holder != self.holder and lease.live(now):
            self._forget(jid)
            return None
        if jid not in self._leased and self.capacity is not None and len(self._leased) >= self.capacity:
            return None
        if jid not in self._leased and not self._assigned(jid):
            return None  # another live member's share: it takes the lease
        try:
            got = await self.store.acquire_lease(jid, self.holder, self.lease)
        except (ConflictError, NotFoundError):
            self._forget(jid)
            return None
        assert got.lease is not None
        if lease is not None and lease.holder != self.holder:  # expired: a dead supervisor's record
            metrics.current().inc("dispatch_leases_taken_over_total")
        if not ours:
            self._fresh.add(jid)  # events may have been someone else's until now: observe before trusting
        self._leased[jid] = now + self.lease  # asked at ``now``: the store's lease ends no sooner
        self._known[jid] = got
        return got

    def _assigned(self, jid: str) -> bool:
        """Whether ``jid`` hashes to this supervisor among the fleet's live members (always, alone)."""
        if len(self._members) < 2:
            return True
        owned = self._owned.get(jid)
        if owned is None:
            if len(self._owned) >= OWNED_CACHE:  # a long-lived daemon sees ever new ids: bounded
                self._owned.clear()
            owned = self._owned[jid] = _owner(jid, self._members) == self.holder
        return owned

    def _newest(self, rec: JobRecord) -> JobRecord:
        """``rec`` or, if newer, the copy of it our last write or lease change left (a scan's records
        are read before the renewals made during the scan, which move their revision: a write from
        the listed copy would only be refused by the compare-and-swap); the newer one is kept."""
        known = self._known.get(rec.job_id)
        if known is not None and known.revision > rec.revision:
            return known
        if rec.job_id in self._leased:
            self._known[rec.job_id] = rec
        return rec

    def _forget(self, jid: str) -> None:
        self._leased.pop(jid, None)
        self._known.pop(jid, None)
        self._fresh.discard(jid)
        self._retry.pop(jid, None)

    async def _let_go(self, jid: str) -> None:
        """The record is final: give its lease back."""
        if jid in self._leased:
            try:
                await self.store.release_lease(jid, self.holder)
            except DispatchError:
                pass
        self._forget(jid)

    async def _update(
        self, jid: str, change: Callable[[JobRecord], decide.Step | None], *, current: JobRecord | None = None
    ) -> JobRecord:
        """The one compare-and-swap loop (:meth:`RecordWriter.update`), only while we hold the lease.
        ``current``: the record as last read or written here, to start from without reading it again
        (a stale one costs a compare-and-swap retry, never a wrong write)."""
        try:
            after = await self._writer.update(jid, change, current=current)
        except LeaseLostError:
            if jid in self._leased:
                metrics.current().inc("dispatch_leases_lost_total")
            self._forget(jid)
            raise
        if jid in self._leased:
            self._known[jid] = after
        return after

    def _written(
        self, before: JobRecord, after: JobRecord, transitions: builtins.list[Transition], now: float
    ) -> None:
        """After each record write of ours: remember the record as written, and count it."""
        if after.job_id in self._leased:
            self._known[after.job_id] = after
        self._count(before, after, transitions, now)

    def _count(
        self, before: JobRecord, after: JobRecord, transitions: builtins.list[Transition], now: float
    ) -> None:
        """Metrics of one record write: a requeue, an incarnation placed, an outcome become final."""
        recorder = metrics.current()
        if not recorder.enabled:
            return
        if after.epoch.r > before.epoch.r and after.epoch.n > before.epoch.n:
            cause = before.outcome.cause
            policy = before.policy if before.policy is not None else self.policy
            rule = cause.value if cause in policy.rules else "default"
            recorder.inc("dispatch_requeues_total", {"cause": cause.value, "rule": rule})
        if (
            after.handle is not None
            and after.handle != before.handle
            and after.handle.identity.epoch.n == after.epoch.n
        ):
            recorder.inc("dispatch_incarnations_started_total")
        # Only a terminal record can be final: most writes (starting, running) skip the decision.
        if (
            after.outcome.terminal
            and decide.final(after, self.policy, now)
            and not (before.outcome.terminal and decide.final(before, self.policy, now))
        ):
            recorder.inc(
                "dispatch_outcomes_total", {"state": after.state.value, "cause": after.outcome.cause.value}
            )

    # ------------------------------------------------------------------ folding

    async def _fold_change(
        self, jid: str, obs: Observation | Absent, *, confirmed: bool, report: StepReport
    ) -> JobRecord | None:
        """Fold a reading into its record if the record is ours; the record after it when it is. An
        absent reading is folded once a second read confirms it (``confirmed``: it was)."""
        if not self._concerns(jid):
            return None
        known = self._known.get(jid) if jid in self._leased else None
        if known is not None:
            # Folded from the record as we last wrote or read it, without reading the store: if another
            # process wrote it since, the compare-and-swap refuses the write and the fold is retried on
            # the record read afresh. When the fold writes nothing, nothing is worked on from a copy
            # that may be stale (the next scan reads the record).
            got = await self._own(known)
            if got is None:
                return None
            new = await self._fold(got, obs, confirmed=confirmed, report=report, read=True)
            return None if new is got else new
        try:
            rec = await self.store.get(jid)
        except NotFoundError:
            if isinstance(obs, Observation):
                await self._unmatched(obs, report)
            return None
        except InvalidError as exc:  # an unreadable record: reported once, left alone
            self._report_unreadable(Unreadable(jid, exc.detail), report)
            return None
        if not self._writer.owns(rec):
            return None
        if rec.outcome.terminal and decide.final(rec, self.policy, self.clock.now()):
            if isinstance(obs, Observation) and _live(obs) and self._unwanted(rec, obs):
                got = await self._own(rec)
                if got is not None:
                    await self._stop_unwanted(got, obs, report)
            return None
        got = await self._own(rec)
        if got is None:
            return None
        return await self._fold(got, obs, confirmed=confirmed, report=report, read=True)

    async def _fold(
        self,
        rec: JobRecord,
        obs: Observation | Absent,
        *,
        confirmed: bool,
        report: StepReport,
        read: bool = False,
    ) -> JobRecord:
        """Fold ``obs`` into ``rec``; ``read``: ``rec`` was just read from the store (the write then
        starts from it rather than reading it again; a stale one only costs a compare-and-swap retry).
        An absent reading not yet ``confirmed`` is read again over a fresh listing first (two absent
        readings, or the listed observation); a cluster that does not answer changes nothing."""
        jid = rec.job_id
        if isinstance(obs, Absent) and not confirmed and matches(rec, obs):
            self._listing = None
            listed = await self._reader.listing()
            if isinstance(listed, Unreachable):
                return rec
            self._listing = listed
            second = await self._reader.confirm(obs, listed)
            if isinstance(second, Unreachable):
                return rec
            obs = second
        now = self.clock.now()
        try:
            new = await self._update(
                jid,
                lambda r: _changed(r, fold(r, obs, now=now, confirmed=True)),
                current=rec if read else None,
            )
        except LeaseLostError:
            return rec
        if new.revision != rec.revision:
            report.folded += 1
            if new.outcome.terminal and not rec.outcome.terminal and new.outcome.cause is not Cause.NONE:
                await record_decision(
                    self.backend,
                    obs.handle,
                    "CauseRead",
                    _cause_read(new),
                    warning=new.state in (State.FAILED, State.LOST),
                )
        return new

    async def _refresh(self, rec: JobRecord, report: StepReport) -> JobRecord:
        """Read the record's current incarnation (by handle, else by identity) and fold it. A cluster
        that does not answer raises ``UnavailableError``: nothing is decided on a record not read."""
        handle = decide.current_handle(rec)
        got: Observation | Absent | Unreachable | None
        if handle is not None:
            got = await self._reader.observe(handle)
        elif rec.unknown_write is None and decide.previous_handle(rec) is None and rec.handle is None:
            got = await self._find(rec)
        else:
            return rec  # a start whose effect is unknown, or a requeue under way: their plans read
        if isinstance(got, Unreachable):
            raise UnavailableError(f"job {rec.job_id}: the cluster does not answer ({got})")
        if got is None:
            return rec
        return await self._fold(rec, got, confirmed=False, report=report)

    async def _find(self, rec: JobRecord) -> Observation | None:
        """The listed observation of the record's current incarnation: the first that
        :func:`~dispatch.fold.matches` it, looked up in an index of the listing (a poll asks this for
        every record placed nowhere yet: a scan of the listing each would be quadratic)."""
        listing = await self._list()
        if self._index is None or self._index[0] is not listing:
            first: dict[tuple[str, int, str], Observation] = {}
            for obs in listing:
                ident = obs.handle.identity
                first.setdefault((ident.job_id, ident.epoch.n, ident.nonce), obs)
            self._index = (listing, first)
        return self._index[1].get((rec.job_id, rec.epoch.n, rec.nonce))

    # ------------------------------------------------------------------ deciding and acting

    async def _scan(self, report: StepReport, *, poll: bool) -> None:
        """Lease every record that needs supervising and work on it (observing first when polling)."""
        recorder = metrics.current()
        try:
            records = await (self._fleet_records() if self._fleet is not None else self.store.list())
        except DispatchError as exc:
            recorder.inc("dispatch_store_errors_total")
            report.errors.append(f"store: {exc}")
            return
        health.current().mark("store")
        for bad in records.unreadable:  # the others are worked on regardless
            self._report_unreadable(bad, report)
        now = self.clock.now()
        if self._fleet is None:
            self._gauges(records, now)
        elif recorder.enabled:  # the counts come from each resync's full listing; the age moves with time
            recorder.set("dispatch_jobs_starting_oldest_seconds", oldest(self._starting, now))
        for rec in records:
            if not self._ours(rec):
                continue
            if decide.final(rec, self.policy, now):
                if rec.job_id in self._leased or (rec.lease is not None and rec.lease.holder == self.holder):
                    await self._let_go(rec.job_id)
                continue
            if not self._assigned(rec.job_id):
                if rec.job_id in self._leased:  # a member joined: its share is handed over between actions
                    await self._let_go(rec.job_id)
                continue
            await self._keepalive()
            await self._work(rec.job_id, report, rec=rec, poll=poll)

    def _gauges(self, records: builtins.list[JobRecord], now: float) -> None:
        recorder = metrics.current()
        if recorder.enabled:
            gauges = tally(records, self._starting, now)
            self._starting = gauges.starting_since
            recorder.set_all("dispatch_jobs", "state", gauges.counts, every=(s.value for s in State))
            recorder.set("dispatch_jobs_starting_oldest_seconds", gauges.oldest_starting)

    async def _keepalive(self, *, due: bool = False) -> None:
        """A fleet member renews its membership and the leases that are half gone: at each scan, and
        between changes when a long step would otherwise let them lapse under load."""
        store = self._fleet
        if store is None or (not due and self.clock.now() < self._next_keepalive):
            return
        group = f"{self.backend.name}/{self.backend.cluster_id}"
        now = self.clock.now()
        self._next_keepalive = now + self.lease / 4  # not every poll: a poll of 0 would renew per record
        try:
            members = await store.heartbeat(group, self.holder, self.lease)
            now_members = tuple(sorted({*members, self.holder}))
            if now_members != self._members:
                # The shares moved: what this member now owns (a dead member's records, ones another
                # member handed over) may lie anywhere in the claimable pages, so they start over.
                self._members, self._owned, self._after = now_members, {}, ""
            due_ids = [jid for jid, until in self._leased.items() if until - now <= self.lease / 2]
            if due_ids:
                for rec in await store.renew_leases(self.holder, self.lease, due_ids):
                    self._leased[rec.job_id] = now + self.lease  # asked at ``now``: it ends no sooner
                    self._known[rec.job_id] = rec
        except DispatchError as exc:
            if due:  # the scan reports it
                raise
            metrics.current().inc("dispatch_store_errors_total")
            log.info("fleet keepalive failed, tried again within a poll: %s", exc)

    async def _fleet_records(self) -> Listing:
        """A fleet member's scan: heartbeat, renew the leases due, then read what it leases and a page
        of claimable records."""
        store = self._fleet
        assert store is not None  # called only for a fleet member
        await self._keepalive(due=True)
        records = await store.leasable(
            self.holder, states=CLAIMABLE, limit=self.claim_batch, after=self._after
        )
        held = {r.job_id for r in records if r.lease is not None and r.lease.holder == self.holder}
        for jid in [j for j in self._leased if j not in held]:  # taken over or purged meanwhile
            self._forget(jid)
        free = len(records) - len(held)
        self._after = records[-1].job_id if free >= self.claim_batch else ""
        return records

    def _report_unreadable(self, bad: Unreadable, report: StepReport) -> None:
        """Name an unreadable record once (not at every step); it is left alone."""
        if bad.job_id not in self._unreadable:
            self._unreadable.add(bad.job_id)
            report.unreadable.append(str(bad))
            log.warning("%s", bad)

    async def _work(
        self, jid: str, report: StepReport, *, rec: JobRecord | None = None, poll: bool = False
    ) -> None:
        """Take the next actions for one record until it waits; a failed action is retried later, with a
        doubling delay for a temporary error and a long one for a permanent error."""
        retry = self._retry.get(jid)
        if retry is not None and self.clock.now() < retry.not_before:
            return
        if rec is not None:
            rec = self._newest(rec)
        try:
            await self._work_on(jid, report, rec, poll)
            self._retry.pop(jid, None)
        except LeaseLostError:
            return
        except NotFoundError:  # the record was purged
            self._forget(jid)
            return
        except DispatchError as exc:
            verdict = decide.classify(exc)
            report.errors.append(f"{jid}: {verdict}")
            attempts = self._retry[jid].attempts + 1 if jid in self._retry else 1
            if isinstance(verdict, decide.TemporaryError):
                delay = min(verdict.delay * 2 ** min(attempts - 1, 10), 300.0)
            else:
                delay = 300.0
            self._retry[jid] = _Retry(attempts, self.clock.now() + delay)
            log.info("job %s: %s; next try in %g s", jid, verdict, delay)

    async def _work_on(self, jid: str, report: StepReport, rec: JobRecord | None, poll: bool) -> None:
        if rec is None:
            rec = await self.store.get(jid)
        got = await self._own(rec)
        if got is None:
            return
        rec = got
        # Observe first when polling, and when the record was someone else's until now.
        if (poll or jid in self._fresh) and not rec.outcome.terminal:
            rec = await self._refresh(rec, report)
            self._fresh.discard(jid)  # only once observed: a failed refresh is tried again
        for _ in range(MAX_ACTIONS):
            now = self.clock.now()
            plan = decide.next(rec, self.policy, now)
            if plan.action is PlanAction.DONE:
                await self._let_go(jid)
                return
            if plan.action is PlanAction.WAIT:
                return
            report.actions.append(f"{jid}@{rec.epoch}: {plan.action.value} ({plan.reason})")
            log.info(
                "%s %s@%s: %s",
                plan.action.value,
                jid,
                rec.epoch,
                plan.reason,
                extra={
                    "job_id": jid,
                    "epoch": str(rec.epoch),
                    "action": plan.action.value,
                    "cause": rec.outcome.cause.value,
                },
            )
            after = await self._act(rec, plan, report)
            if after is None:
                return
            rec = after

    async def _act(self, rec: JobRecord, plan: Plan, report: StepReport) -> JobRecord | None:
        """Perform ``plan`` for ``rec``; the record after it, or ``None`` to wait for a later step."""
        jid = rec.job_id
        now = self.clock.now()
        action = plan.action
        if action is PlanAction.REQUEUE:
            after = await self._update(
                jid, lambda r: decide.requeued(r, plan, now=now) if _same(rec, r) else None, current=rec
            )
            if after.revision != rec.revision:
                why = f"job {jid} epoch {rec.epoch}: requeued as epoch {after.epoch}: {plan.reason}"
                await record_decision(self.backend, decide.current_handle(rec), "Requeued", why)
            return after
        if action in (PlanAction.FAIL, PlanAction.HOLD):
            after = await self._update(
                jid, lambda r: decide.gave_up(r, plan, now=now) if _same(rec, r) else None, current=rec
            )
            if after.revision != rec.revision:
                reason = "GaveUp" if action is PlanAction.FAIL else "HeldByPolicy"
                why = f"job {jid} epoch {rec.epoch}: {plan.reason}"
                await record_decision(self.backend, rec.handle, reason, why, warning=True)
            return after
        if action is PlanAction.SETTLE:
            return await self._settle(rec, report)
        if action is PlanAction.CEASE:
            return await self._cease(rec, report)
        if action is PlanAction.STOP:
            if rec.cancel_requested:
                return await self._cancel(rec, report)
            return await self._reap(rec, plan, report)
        if action is PlanAction.START:
            return await self._start(rec, report)
        raise InvalidError(f"no way to perform {action.value}", path="plan.action")  # pragma: no cover

    async def _settle(self, rec: JobRecord, report: StepReport) -> JobRecord | None:
        """A write's effect is unknown: look the identity up on the cluster and fold what is there."""
        self._listing = None  # a fresh listing: the one cached may predate the write
        found = await self._find(rec)
        if found is not None:
            return await self._fold(rec, found, confirmed=True, report=report)
        prev = decide.previous_handle(rec)
        if prev is not None:
            obs = await self._reader.observe(prev)
            if isinstance(obs, Unreachable):
                raise UnavailableError(f"job {rec.job_id}: the cluster does not answer ({obs})")
            why = f"observed {prev.identity}: {obs.state.value if isinstance(obs, Observation) else 'absent'}"
        else:
            why = f"no object carries {rec.job_id}@{rec.epoch}: it did not take effect"
        now = self.clock.now()
        return await self._update(
            rec.job_id, lambda r: decide.settled(r, why, now=now) if _same(rec, r) else None
        )

    async def _stop(self, handle: Handle, report: StepReport, *, why: str) -> bool:
        """Stop an incarnation (idempotent); a lost response is settled by the next observation. Whether
        a stop was sent now (not within a poll of the last one)."""
        now = self.clock.now()
        asked = self._stopped.get(handle.ref)
        if asked is not None and now - asked < self.poll:
            return False
        try:
            await self.backend.stop(handle)
        except OutcomeUnknownError as exc:
            report.errors.append(f"stop {handle.identity}: {exc}")
        except DispatchError as exc:
            report.errors.append(f"stop {handle.identity}: {exc}")
            return False
        self._stopped[handle.ref] = now
        report.actions.append(f"{handle.identity.job_id}: stopped {handle.identity} ({why})")
        return True

    async def _reap(self, rec: JobRecord, plan: Plan, report: StepReport) -> JobRecord | None:
        """Stop what remains of an incarnation that ended on the cluster (see ``decide._reap``): recorded
        first, then sent; its outcome stays the cluster's."""
        handle = decide.current_handle(rec)
        if handle is None:
            return None
        now = self.clock.now()
        after = await self._update(
            rec.job_id, lambda r: decide.stop_asked(r, plan, now=now) if _same(rec, r) else None, current=rec
        )
        if after.revision != rec.revision:
            self._stopped.pop(handle.ref, None)
            await self._stop(handle, report, why=plan.reason)
        return None

    async def _gone(self, handle: Handle) -> bool:
        """True once no compute of the incarnation remains (see :func:`dispatch.backend.compute_gone`)."""
        return await compute_gone(
            self.backend, handle, cessation=(await self._caps()).cessation, listing=self._fresh_listing
        )

    async def _fresh_listing(self) -> builtins.list[Observation]:
        self._listing = None  # the cached one may predate the stop
        return await self._list()

    async def _cease(self, rec: JobRecord, report: StepReport) -> JobRecord | None:
        prev = decide.previous_handle(rec)
        assert prev is not None
        if not await self._gone(prev):
            await self._stop(prev, report, why=f"requeue of {rec.job_id} to {rec.epoch}")
            if not await self._gone(prev):
                self._next_scan = min(self._next_scan, self.clock.now() + self.poll)
                return None  # pods linger: check again at a later step, never block the loop
        now = self.clock.now()
        self._stopped.pop(prev.ref, None)
        return await self._update(rec.job_id, lambda r: decide.ceased(r, prev, now=now), current=rec)

    async def _cancel(self, rec: JobRecord, report: StepReport) -> JobRecord | None:
        handle = decide.current_handle(rec)
        if handle is None:
            found = await self._find(rec)
            if found is not None:  # started before a crash, the handle never recorded
                rec = await self._fold(rec, found, confirmed=True, report=report)
                handle = found.handle
        now = self.clock.now()
        if handle is None:
            return await self._update(
                rec.job_id,
                lambda r: (
                    decide.cancelled_off_cluster(r, actor=Actor.SUPERVISOR, now=now)
                    if _same(rec, r)
                    else None
                ),
            )
        if rec.outcome.terminal:
            return rec
        if handle.ref not in self._stopped:  # one Event, not one per step until the stop is done
            # Told before the stop: a stop deletes the TrainJob, and an Event is recorded on a live object.
            why = (
                f"job {rec.job_id} epoch {rec.epoch}: carrying out the cancel request; stopping {handle.ref}"
            )
            await record_decision(self.backend, handle, "Cancelled", why)
        await self._stop(handle, report, why="cancel requested")
        obs = await self._reader.observe(handle)
        if isinstance(obs, Unreachable):
            return None
        after = await self._fold(rec, obs, confirmed=False, report=report)
        return None if not after.outcome.terminal else after

    async def _start(self, rec: JobRecord, report: StepReport) -> JobRecord | None:
        identity = rec.identity
        try:
            prepared = await self.backend.prepare(rec.spec, identity, held=False)
        except (InvalidError, UnsupportedError) as exc:  # what the cluster cannot run fails the job
            refused, now = exc, self.clock.now()
            return await self._update(
                rec.job_id,
                lambda r: decide.start_refused(r, identity, refused, now=now) if _same(rec, r) else None,
            )
        # A failed start is retried at a later step: nothing is written for it (record_failures).
        after, handle = await self._writer.start(
            prepared, actor=Actor.SUPERVISOR, record_failures=False, current=rec
        )
        if handle is not None and identity.epoch.r > 0 and after.handle == handle:
            # The requeue told on the new incarnation too: the old TrainJob is usually deleted by now.
            why = f"job {rec.job_id} epoch {identity.epoch}: placed as a requeue"
            why += f": {rec.plan.reason}" if rec.plan is not None and rec.plan.reason else ""
            await record_decision(self.backend, handle, "Requeued", why)
        moved = after.cancel_requested or after.outcome.terminal or after.epoch.n != identity.epoch.n
        if handle is not None and moved:
            # Cancelled (or resubmitted) while it was being placed: the new incarnation is not wanted.
            await self._stop(handle, report, why="placed after its record moved on")
        return after


def _live(obs: Observation) -> bool:
    """Whether an observed incarnation still has (or may have) compute: leftovers to stop."""
    return obs.compute is Compute.PRESENT or (obs.compute is Compute.UNKNOWN and not obs.outcome.terminal)


def _owner(job_id: str, members: tuple[str, ...]) -> str:
    """The member a job belongs to: the highest hash of member and job id (rendezvous hashing), so a
    member joining or leaving moves only its own share."""
    return max(members, key=lambda m: hashlib.blake2b(f"{m}\x00{job_id}".encode(), digest_size=8).digest())


def _cause_read(rec: JobRecord) -> str:
    """The message of a ``CauseRead`` decision: the outcome, its cause and the first evidence."""
    first = rec.outcome.evidence[0] if rec.outcome.evidence else None
    seen = f" ({first.kind} {first.name}: {first.reason} {first.message})".rstrip() if first else ""
    return f"job {rec.job_id} epoch {rec.epoch}: {rec.state.value}, cause {rec.outcome.cause.value}{seen}"


def _same(before: JobRecord, now: JobRecord) -> bool:
    """True when the record is still the incarnation and state a decision was made on."""
    return (
        now.epoch == before.epoch
        and now.outcome.state is before.outcome.state
        and now.handle == before.handle
        and now.cancel_requested == before.cancel_requested
    )


def _changed(rec: JobRecord, result: tuple[JobRecord, builtins.list[Transition]]) -> decide.Step | None:
    new, transitions = result
    return None if new is rec else (new, transitions)


class WatchFeed:
    """One watch kept open: a task reads it into a buffer that :meth:`take` empties (only the changes
    ``keep`` accepts, when given: the others are read past, the cursor moving on). When the watch ends
    or drops, it is opened again from the last change's cursor (the kopf ``continuous_watch`` model),
    after a doubling pause (0.5 s to 30 s) when it failed."""

    def __init__(
        self,
        backend: Watcher,
        cursor: str | None,
        clock: Clock,
        *,
        keep: Callable[[Change], bool] | None = None,
    ) -> None:
        self.cursor = cursor
        """The cursor of the last change read (kept or not)."""
        self._backend = backend
        self._clock = clock
        self._keep = keep
        self._buffer: builtins.list[Change] = []
        self._ready = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read(), name="dispatch-watch-feed")

    def take(self) -> builtins.list[Change]:
        """Every change read since the last call."""
        out, self._buffer = self._buffer, []
        self._ready.clear()
        return out

    async def wait(self) -> None:
        """Return once there is a change to take."""
        await self._ready.wait()

    async def _read(self) -> None:
        quiet = 0  # watches in a row that failed, or ended without a change
        while True:
            changes = self._backend.watch(self.cursor)
            delivered = failed = False
            try:
                async for change in changes:
                    health.current().mark("cluster")
                    self.cursor = change.cursor
                    delivered = True
                    if self._keep is None or self._keep(change):
                        self._buffer.append(change)
                        self._ready.set()
            except DispatchError as exc:
                failed = True
                log.info("watch interrupted, resuming from the last cursor: %s", exc)
            except Exception:
                # A bug (an adapter's), not a dropped watch: said loudly, with its traceback, and the
                # watch opened again like a dropped one. Ending the task instead would leave the
                # supervisor on its polls alone, slower, and silent about why.
                failed = True
                log.exception("watch failed unexpectedly, resuming from the last cursor")
            finally:
                await _aclose(changes)
            # A watch that delivered and then ended (a server timeout) is resumed at once.
            quiet = quiet + 1 if failed or not delivered else 0
            await self._clock.sleep(min(_FEED_PAUSE * 2 ** (quiet - 1), _FEED_PAUSE_MAX) if quiet else 0.0)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


_FEED_PAUSE = 0.5
_FEED_PAUSE_MAX = 30.0


async def _aclose(changes: AsyncIterator[Change]) -> None:
    aclose = getattr(changes, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except (DispatchError, RuntimeError):
            pass
