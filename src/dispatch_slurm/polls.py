"""The Slurm adapter's source of readings for the host's feed: :class:`Polls` (SPEC §5, §13 "Watch").

One poll — one ``squeue --json --states=all`` for every job, and accounting or the completion log only for
incarnations that left the queue, one call for all of them (:meth:`Observing.poll`) — per
``pollInterval`` while anything watches (the feed stops its source when the last watcher leaves: no poll
runs when nobody watches). Each reading is offered to the feed, which emits only real changes; a poll
that cannot read the cluster offers nothing and tells the feed why (an outage changes no reading).

**A poll is never cut short.** A poll in flight finishes, and its readings reach the feed, even when the
watch that started it closes first: a supervisor's step reads the watch for what it holds *now* and
closes it at once, and the poll it started must still land for the next step to read.

**A watch starts from a fresh poll.** :meth:`fresh` (awaited before a watch reads the feed) waits for a
poll when the last one is older than the interval, so a watch opened after an idle spell does not start
from readings the feed kept from long ago.

**The end marker asks early; Slurm answers.** The batch script writes ``ended`` into the incarnation's
directory as it exits (:mod:`~dispatch_slurm.script`). While every incarnation the feed holds unended is
running — nothing can change but an end —, the marker files are looked at each second (one ``sh`` on
the login node, not a Slurm command), and once every one of them has written its marker, a poll runs at
once instead of at the end of the interval; if Slurm does not show them all ended yet (``COMPLETING``),
the next early poll waits twice as long, up to the interval. The marker is never a reading: the job's
state is what squeue says.
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

    async def fresh(self) -> None:
        """Return once the feed holds a poll younger than the interval (waiting for one in flight, or
        for a new one)."""
        if self._running is None and time.monotonic() - self._asked < self.interval:
            return
        await self.poll()

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
        """Whether every incarnation the feed holds unended runs and has written its end marker."""
        live = [r for r in self.feed.readings() if _live(r)]
        if not live or any(isinstance(r, Observation) and r.compute is not Compute.PRESENT for r in live):
            return False  # something pends or cannot be told: only a poll can say when it changes
        paths = [self._marker(r.handle) for r in live]
        try:
            written = await self.observing.queries.existing(paths)
        except UnavailableError as exc:
            _log.debug("cannot look at the end markers: %s", exc)
            return False
        return len(written) == len(set(paths))

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
