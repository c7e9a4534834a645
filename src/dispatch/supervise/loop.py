"""The supervisor's loop: :class:`Supervisor`, which composes the parts of a step (see
:mod:`dispatch.supervise`) and turns it: :meth:`Supervisor.step`, :meth:`Supervisor.run`, and the leases
released at :meth:`Supervisor.close`."""

from __future__ import annotations

import asyncio
import builtins
import logging
import math
import os
import random
import socket
import time
from collections.abc import Awaitable, Callable, Collection
from typing import Any

from dispatch import chance, decide, health, metrics
from dispatch.backend import Backend, Watcher
from dispatch.clock import Clock, SystemClock
from dispatch.errors import DispatchError, InvalidError, UnsupportedError
from dispatch.model import DEFAULT_POLICY, Change, JobRecord, Policy, State, Unreachable
from dispatch.records import Store

from .acting import Acting
from .folding import Folding
from .gauges import Gauges
from .ground import Ground, Placing
from .leases import CLAIM_BATCH, STRIDE, Leases
from .reconcile import Reconciler, UnmatchedPolicy
from .report import StepReport
from .view import ClusterView
from .watchfeed import WatchFeed, drain

__all__ = ["PAUSE", "RESYNC_JITTER", "Supervisor"]

log = logging.getLogger("dispatch.supervise")

RESYNC_JITTER = 0.9
"""The shortest interval between two resyncs, as a fraction of ``resync`` (see ``Supervisor.step``)."""
PAUSE = 0.02
"""Seconds (of the process's own monotonic time) a scan or a resync works before it folds the watch
changes that came meanwhile (see ``Supervisor._between``)."""


class Supervisor:
    """Supervises the records of one store on one backend. See :mod:`dispatch.supervise`.

    ``policy`` applies to records without their own; ``holder`` names this supervisor in leases
    (default: host, pid and a random suffix); ``lease`` is the lease duration and ``poll`` the interval
    between polls (and between checks of lingering compute), in seconds of ``clock``; ``resync`` how often
    the whole cluster is listed; ``jobs`` restricts it to some job ids (``dispatch run``), ``exclude``
    leaves some alone (records of a cluster that is gone: the CLI's stopped dev cluster); ``capacity``
    caps how many records it leases at once; ``placer`` places each next incarnation in a fleet of clusters
    (SPEC §15; :class:`dispatch.fleet.Fleet` gives one supervisor per cluster the same placer).

    **A fleet.** Over a store with :class:`~dispatch.records.Leasing` (all three dispatch stores), a
    supervisor that looks after every job, without a ``capacity``, is a member of a fleet: at each scan it renews its membership
    (a heartbeat in the store, for ``lease`` seconds), and it leases only the jobs of its
    :class:`~dispatch.model.Share` among the live members (job ids hashed to buckets, buckets to members
    by rendezvous hashing), so N members split the work evenly and a member that dies or stops has its
    share spread over the others (once its membership and leases expire, or at once when it closes). A
    scan reads the records it leases plus a page of ``claim_batch`` claimable ones (not every record);
    its leases are renewed in one call; its watch asks for the changes of its share alone. A record is
    still acted on only under our live lease, with compare-and-swap: the hash decides who tries, the
    lease who may.
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
        placer: Placing | None = None,
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
        self.cursor: str | None = None
        """The watch cursor: where the next drain resumes (``None``: relist)."""
        self._feed: WatchFeed | None = None
        self._next_scan = -math.inf
        self._next_resync = -math.inf
        self._closed = False
        self._gauges = Gauges()
        self._report = StepReport()  # the step under way's, which what is done between pages adds to
        self._pause_due = -math.inf  # when a long scan next folds the watch's changes (monotonic)
        # The parts of a step, each of which knows only those before it.
        ground = Ground(backend, store, self.clock, policy, self.holder, placer)
        self._view = ClusterView(backend, self.clock)
        self._leases = Leases(
            ground,
            lease=self.lease,
            jobs=self.jobs,
            exclude=self.exclude,
            capacity=capacity,
            claim_batch=claim_batch,
            pause=lambda: self._between(self._report),
        )
        self._folding = Folding(ground, leases=self._leases, view=self._view)
        self._writer = self._folding.writer
        self._acting = Acting(
            ground,
            poll=self.poll,
            leases=self._leases,
            view=self._view,
            folding=self._folding,
            soon=self._soon,
        )
        self._reconciler = Reconciler(
            ground,
            unmatched=self.unmatched,
            leases=self._leases,
            view=self._view,
            folding=self._folding,
            acting=self._acting,
        )

    @property
    def unreachable(self) -> Unreachable | None:
        """Since when, and why, this supervisor has not been able to read its cluster (``None``: its last
        read succeeded, and its watch's source answers: :attr:`ClusterView.unreachable`)."""
        return self._view.unreachable

    def __repr__(self) -> str:
        leased = len(self._leases.until)
        return f"Supervisor(holder={self.holder!r}, backend={self.backend.name!r}, leased={leased})"

    @property
    def leased(self) -> frozenset[str]:
        """The job ids this supervisor holds a lease on (as far as it knows)."""
        return frozenset(self._leases.until)

    def _wanted(self, change: Change) -> bool:
        """Whether a watch change is this supervisor's to fold (:meth:`Leases.concerns`). A fleet member's
        watch asks for its share alone; the kept watch buffers, and wakes the loop for, only these."""
        return self._leases.concerns(change.handle.identity.job_id)

    def _soon(self, at: float) -> None:
        """Scan again no later than ``at`` (lingering compute to check again)."""
        self._next_scan = min(self._next_scan, at)

    # ------------------------------------------------------------------ the loop

    async def step(self) -> StepReport:
        """One pass: observe, lease, decide and act. Never waits on the cluster."""
        report = self._report = StepReport()
        self._view.forget_listing()
        now = self.clock.now()
        touched: dict[str, JobRecord] = {}  # job id -> its record as the last fold left it, to act on
        watching = await self._view.watching()
        if watching:
            if self._feed is not None:
                changes = self._feed.take()
                self.cursor = self._feed.cursor
            else:
                changes, self.cursor = await drain(self.backend, self.cursor, self._leases.share)
            touched = await self._fold(changes, report)
        if now >= self._next_resync:
            # 90-100 % of the interval, drawn each time (controller-runtime jitters its SyncPeriod the
            # same way): members started together do not list the store and the cluster all at once.
            self._next_resync = now + self.resync * self.rng.uniform(RESYNC_JITTER, 1.0)
            if not await self._reconcile(report):
                # The cluster did not answer: list it again with the next scan, a poll from now (at once
                # made `run` step without pause, a busy loop, for as long as the cluster was down). The
                # same moment as the scan's, so no step comes between without the error: the daemon
                # counts failing steps in a row to tell a cluster that is gone.
                self._next_resync = now + self.poll
        if now >= self._next_scan:
            self._next_scan = now + self.poll
            await self._scan(report, poll=not watching)
            touched.clear()  # the scan worked on every record
        for jid in sorted(touched):
            await self._leases.keepalive()
            await self._acting.work(jid, report, rec=touched[jid])
        report.leased = len(self._leases.until)
        if self._feed is not None:
            self._feed.follow(self._leases.share)  # a fleet member's share, as of this step
        return report

    async def _fold(self, changes: builtins.list[Change], report: StepReport) -> dict[str, JobRecord]:
        """Fold watch changes into their records; the records folded, by job id, to act on."""
        report.changes += len(changes)
        if changes:
            self._view.reader.answered()  # the watch delivered: the cluster answers
        touched: dict[str, JobRecord] = {}  # job id -> its record as the last fold left it
        # Level, not edge: only the newest reading of each incarnation is folded (what the watch
        # delivered in between says nothing the newest does not, and a fold is a store write).
        latest: dict[str, Change] = {}
        for change in changes:
            latest.pop(change.handle.ref, None)
            latest[change.handle.ref] = change
        for i, change in enumerate(latest.values()):
            jid = change.handle.identity.job_id
            if i % STRIDE == STRIDE - 1:
                # Between changes of a long batch (a relist: 100,000) the leases due are renewed; not
                # before the batch's first changes: renewing 100,000 leases takes seconds, and the
                # changes in hand would wait for all of it (leases are renewed at half: a batch's
                # folds are nothing beside the half left).
                await self._leases.keepalive()
            try:
                folded = await self._reconciler.change(jid, change.reading, report=report)
                if folded is not None:
                    touched[jid] = folded
                    metrics.current().observe(
                        "dispatch_event_record_lag_seconds",
                        max(0.0, self.clock.now() - change.reading.at),
                    )
            except DispatchError as exc:  # this change is seen again at the next resync
                report.errors.append(f"{jid}: {type(exc).__name__}: {exc}")
        return touched

    async def _between(self, report: StepReport) -> None:
        """Between two records of a scan or a resync, with a watch kept open, every :data:`PAUSE`
        seconds: let the loop turn, then fold and act on the changes that came meanwhile — a change
        does not wait for the end of a scan of every record (seconds, at 100,000 jobs)."""
        if self._feed is None:
            return  # ``step`` alone (the simulation): the changes are read at the next step
        now = time.monotonic()
        if now < self._pause_due:
            return
        self._pause_due = now + PAUSE
        await asyncio.sleep(0)
        changes = self._feed.take()
        if not changes:
            return
        self.cursor = self._feed.cursor
        touched = await self._fold(changes, report)
        for jid in sorted(touched):
            await self._leases.keepalive()
            await self._acting.work(jid, report, rec=touched[jid])

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
            if await self._view.watching():
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
                recorder.set("dispatch_leases_held", len(self._leases.until))
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
            self._feed = WatchFeed(
                self.backend, self.cursor, self.clock, keep=self._wanted, share=self._leases.share
            )

    async def close(self) -> None:
        """Release every lease this supervisor holds (another one may take them at once). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._feed is not None:
            await self._feed.close()
            self._feed = None
        await self._leases.release_all()

    # ------------------------------------------------------------------ observing and scanning

    async def _reconcile(self, report: StepReport) -> bool:
        """List the cluster: fold what the watch may have missed, handle unmatched objects, and stop
        incarnations that no record wants. False when the cluster could not be listed."""
        try:
            listing = await self._view.list()
        except DispatchError as exc:
            report.errors.append(f"list: {exc}")
            return False
        fleet = self._leases.fleet
        try:
            if fleet is not None and self.unmatched is UnmatchedPolicy.IGNORE:
                # A fleet member reads only the records it needs, not every record of the store.
                known = await self._leases.resync_records(listing)
                if metrics.current().enabled:
                    starting = await self.store.list(states=[State.STARTING])
                    self._gauges.count(starting, self.clock.now(), counts=await fleet.counts())
            else:
                listed_records = await self.store.list()
                known = {r.job_id: r for r in listed_records}
                if fleet is not None:
                    self._gauges.count(listed_records, self.clock.now())
        except DispatchError:
            metrics.current().inc("dispatch_store_errors_total")
            raise
        health.current().mark("store")
        # Passes over 100,000 readings and records: the watch's changes are folded every STRIDE of
        # them (each pass took 50–150 ms, a stall every resync).
        listed: set[tuple[str, int]] = set()
        for i, o in enumerate(listing):
            if i % STRIDE == STRIDE - 1:
                await self._between(report)
            listed.add((o.handle.identity.job_id, o.handle.identity.epoch.n))
        for i, rec in enumerate(list(known.values())):
            if i % STRIDE == STRIDE - 1:
                await self._between(report)
            # An incarnation of ours missing from the listing may be gone: observe it before trusting
            # the record (the watch event that said so may have gone to another supervisor).
            handle = decide.current_handle(rec)
            mine = handle is not None and not rec.outcome.terminal and rec.job_id in self._leases
            if mine and (rec.job_id, rec.epoch.n) not in listed:
                self._leases.fresh.add(rec.job_id)
        for obs in listing:
            await self._between(report)
            try:
                await self._reconciler.listed(obs, known, report)
            except DispatchError as exc:
                report.errors.append(f"{obs.handle.identity}: {type(exc).__name__}: {exc}")
        return True

    async def _scan(self, report: StepReport, *, poll: bool) -> None:
        """Lease every record that needs supervising and work on it (observing first when polling)."""
        leases = self._leases
        try:
            records = await (leases.fleet_records() if leases.fleet is not None else self.store.list())
        except DispatchError as exc:
            metrics.current().inc("dispatch_store_errors_total")
            report.errors.append(f"store: {exc}")
            return
        health.current().mark("store")
        for bad in records.unreadable:  # the others are worked on regardless
            self._reconciler.unreadable(bad, report)
        now = self.clock.now()
        if leases.fleet is None:
            self._gauges.count(records, now)
        else:  # the counts come from each resync (the store counts); the age moves with time
            self._gauges.age(now)
        for rec in records:
            await self._between(report)
            if not poll and leases.idle(leases.newest(rec)):
                continue  # waiting for the cluster, as at the last scan: nothing to do
            if not leases.ours(rec):
                if rec.job_id in leases or leases.names_us(rec):  # handed to another cluster of a fleet
                    await leases.let_go(rec.job_id, rec)  # (its last write was ours)
                continue
            if decide.final(rec, self.policy, now):
                if rec.job_id in leases or leases.names_us(rec):
                    await leases.let_go(rec.job_id, rec)
                continue
            if not leases.assigned(rec.job_id):
                if rec.job_id in leases or leases.names_us(rec):  # a member joined: its share is handed
                    await leases.let_go(rec.job_id, rec)  # over between actions
                continue
            await leases.keepalive()
            await self._acting.work(rec.job_id, report, rec=rec, poll=poll)
