"""The Slurm adapter's source of readings for the host's feed: :class:`Polls` (SPEC §5, §13 "Watch").

One poll — one ``squeue --json --states=all`` for every job, and accounting or the completion log only for
incarnations that left the queue, one call for all of them (:meth:`Observing.poll`) — per
``pollInterval`` while anything watches (the feed stops its source when the last watcher leaves: no poll
runs when nobody watches). Each reading is offered to the feed, which emits only real changes; a poll
that cannot read the cluster offers nothing and tells the feed why (an outage changes no reading).

**A poll is never cut short.** A poll in flight finishes, and its readings reach the feed, even when the
watch that started it closes first: a supervisor's step reads the watch for what it holds *now* and
closes it at once, and the poll it started must still land for the next step to read.

**A watch starts from a fresh reading.** :meth:`fresh` (awaited before a watch reads the feed) waits for
a poll when the feed's readings are older than the interval, so a watch opened after an idle spell does not
start from readings the feed kept from long ago. ``sbatch``'s answer is a reading too (the job is queued,
:meth:`submitted`): a watch that starts right after the submits of every job it holds costs no poll.

**The end marker asks early; Slurm answers.** The batch script removes ``ended`` from the incarnation's
directory as it starts and writes it as it exits (:mod:`~dispatch_slurm.script`). While anything watches,
the markers of every incarnation the feed holds unended — running or still waiting for a slot: a short job
may start and end between two polls — are looked at each second (one ``sh`` on the login node, not a Slurm
command). A poll is brought forward only when it can conclude: once every one of them has written its
marker, it runs at once instead of at the end of the interval; if Slurm does not show them all ended yet
(``COMPLETING``), the next early poll waits twice as long, up to the interval. Any other change (a start,
one end among jobs that go on) waits for the interval's poll. The marker is never a reading: the job's
state is what squeue says. A marker a poll finds beside a job Slurm shows waiting again (a requeue in
place: Slurm's own, or a hold of a running job) is an earlier run's, and counts for nothing until the
script removes it as it starts again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Sequence

from dispatch.errors import UnavailableError
from dispatch.feed import Feed
from dispatch.model import Absent, Compute, Handle, Observation, Unreachable
from dispatch_slurm.observing import Observing
from dispatch_slurm.script import end_marker

__all__ = ["TICK", "Polls"]

_log = logging.getLogger(__name__)

TICK = 1.0
"""Seconds between two looks at the end markers (at most), and the first gap of an early poll."""


def _pending(reading: Observation | Absent) -> bool:
    """Waiting for a slot (queued or held): not ended, and no compute of it is there."""
    return (
        isinstance(reading, Observation) and not reading.outcome.terminal and reading.compute is Compute.GONE
    )


def _live(reading: Observation | Absent) -> bool:
    return isinstance(reading, Observation) and not (
        reading.outcome.terminal and reading.compute is not Compute.PRESENT
    )


class Polls:
    """The polls of one backend (see the module docstring); :meth:`fill` is its feed's source."""

    def __init__(self, observing: Observing, interval: float) -> None:
        self.observing = observing
        self.interval = interval
        self.tick = min(TICK, interval)
        self.count = 0
        """How many polls ran (one ``squeue`` each, and one ``sacct`` for those that left the queue)."""
        self.early = 0
        """How many of them an end marker brought forward."""
        self._asked = -math.inf  # monotonic time the last poll was asked
        self._early_gap = self.tick
        self._written: set[str] = set()  # the end markers the last look found
        self._stale: set[str] = set()  # of those, the ones a poll found beside a job waiting again
        self._running: asyncio.Task[None] | None = None

    @property
    def feed(self) -> Feed:
        return self.observing.feed

    async def fill(self, feed: Feed) -> None:
        """The feed's source: a poll whenever one is due, for as long as anything watches."""
        while True:
            early = await self._due()
            self._early_gap = min(self._early_gap * 2, self.interval) if early else self.tick
            await self.poll()

    def current(self) -> bool:
        """Whether the feed's readings are younger than the interval (the last poll's, or the submits'
        since: :meth:`submitted`) and no poll is in flight: the feed's ``current``."""
        return self._running is None and time.monotonic() - self._asked < self.interval

    async def fresh(self) -> None:
        """Return once the feed's readings are current (waiting for a poll in flight, or a new one)."""
        if not self.current():
            await self.poll()

    def submitted(self, handle: Handle, asked: float) -> None:
        """``sbatch`` queued incarnation ``handle`` (asked at monotonic time ``asked``; its reading offered
        to the feed). The feed's readings count from the last poll; when it held nothing else unended, they
        count from this submit: the next poll is due an interval after it, not at once."""
        if not any(_live(r) and r.handle.ref != handle.ref for r in self.feed.readings()):
            self._asked = max(self._asked, asked)

    async def poll(self) -> None:
        """Run a poll (or join the one in flight); cancelling the caller does not cancel the poll."""
        if self._running is None:
            self._running = asyncio.get_running_loop().create_task(self._poll(), name="dispatch-slurm-poll")
            self._running.add_done_callback(_retrieved)
        await asyncio.shield(self._running)

    async def _poll(self) -> None:
        try:
            self._asked = time.monotonic()
            self.count += 1
            at = time.time()
            live = [r.handle for r in self.feed.readings() if _live(r)]
            try:
                found = await self.observing.poll(live, at)
            except UnavailableError as exc:
                _log.info("a poll could not read the cluster: %s", exc)
                self.feed.troubled(Unreachable(at, str(exc)))
                return
            self.feed.troubled(None)
            self._offer(found)
            self._mark_stale()
        finally:
            self._running = None

    def listed(self, found: Sequence[Observation], asked: float) -> None:
        """The readings of a listing made outside the polls (``list()``: the same ``squeue``, asked at
        monotonic time ``asked``): offered like a poll's, and the next poll is due an interval after it."""
        self._asked = max(self._asked, asked)
        self._offer(found)

    def _offer(self, found: Sequence[Observation | Absent]) -> None:
        # A reading older than the one the feed holds for its incarnation (an answer that took longer than
        # a later one) says nothing new: the newer one stands.
        for reading in found:
            last = self.feed.last(reading.handle.ref)
            if last is None or last.at <= reading.at:
                self.feed.offer(reading)

    def _mark_stale(self) -> None:
        """After a poll: a marker the last look found beside a job Slurm now shows waiting is an earlier
        run's (the script removes it as it starts): it says nothing until it is gone and written again."""
        for r in self.feed.readings():
            if _pending(r) and (path := self._marker(r.handle)) in self._written:
                self._stale.add(path)

    async def _due(self) -> bool:
        """Wait until a poll is due: ``True`` when an end marker brought it forward."""
        while True:
            since = time.monotonic() - self._asked
            if since >= self.interval:
                return False
            if since >= self._early_gap and await self._all_ended():
                self.early += 1
                return True
            await asyncio.sleep(min(self.tick, self.interval - since))

    async def _all_ended(self) -> bool:
        """Whether every incarnation the feed holds unended has written its end marker (one still waiting
        has none — its directory was made empty, and the script removes it as it starts — unless an
        earlier run of it wrote one, which a poll then finds stale: :meth:`_mark_stale`)."""
        live = [r for r in self.feed.readings() if _live(r)]
        if not live:
            return False
        paths = {self._marker(r.handle) for r in live}
        try:
            written = await self.observing.queries.existing(sorted(paths))
        except UnavailableError as exc:
            _log.debug("cannot look at the end markers: %s", exc)
            return False
        self._written = written
        self._stale &= written  # a marker removed (its job started again) is no longer stale
        return paths <= written - self._stale

    def _marker(self, handle: Handle) -> str:
        return end_marker(self.observing.info.workdir, handle.identity)

    async def close(self) -> None:
        """Cancel a poll in flight (the backend is closing)."""
        running = self._running
        if running is not None:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)


def _retrieved(task: asyncio.Task[None]) -> None:
    """A poll whose caller left before it ended: its failure (an adapter's bug) is logged, not lost."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        _log.error("a poll failed unexpectedly", exc_info=exc)
