"""One subscription to the store's changes, fanned out to every open page.

Each browser tab holds a server-sent-events stream; rather than a store subscription per tab (SQLite's
feed polls the file), :class:`Broadcast` keeps one, read through the cluster: it follows
:meth:`Cluster.changes() <dispatch.Cluster.changes>` when the store has a change feed, else it polls
:meth:`Cluster.records() <dispatch.Cluster.records>` and compares revisions. A
subscriber gets job ids, or :data:`RESYNC` when changes may have been missed (the feed lost its source,
or the subscriber fell behind): then it re-reads everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

from dispatch.errors import DispatchError

if TYPE_CHECKING:
    from dispatch.cluster import Cluster
    from dispatch.fleet import Fleet

__all__ = ["RESYNC", "Broadcast"]

RESYNC = ""
"""What a subscriber receives when it may have missed changes: re-read everything."""

POLL = 2.0
"""Seconds between listings for a store without a change feed."""
RETRY = 1.0
"""Seconds before subscribing again after the feed lost its source."""
BACKLOG = 256
"""Job ids a slow subscriber may fall behind by before it is told to re-read everything instead."""

_log = logging.getLogger(__name__)


class Broadcast:
    """Follows the store's changes once (from :meth:`start` to :meth:`stop`) for every subscriber."""

    def __init__(self, cluster: Cluster | Fleet, *, poll: float = POLL) -> None:
        self._cluster = cluster
        self._poll = poll
        self._queues: set[asyncio.Queue[str | None]] = set()
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> None:
        """Subscribe to the store; return once subscribed (a change committed from then on is seen)."""
        if self._task is None:
            self._task = asyncio.create_task(self._follow(), name="dispatch-ui-feed")
        # A store that cannot be reached yet still lets the pages serve: they say so themselves.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), 5.0)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @contextlib.contextmanager
    def subscription(self) -> Iterator[asyncio.Queue[str | None]]:
        """A queue of job ids as they change (``RESYNC``: re-read everything; ``None``: the server is
        stopping), for as long as the ``with`` lasts."""
        queue: asyncio.Queue[str | None] = asyncio.Queue(BACKLOG)
        self._queues.add(queue)
        try:
            yield queue
        finally:
            self._queues.discard(queue)

    def close(self) -> None:
        """Tell every subscriber the server is stopping (so open streams end at once)."""
        for queue in list(self._queues):
            while not queue.empty():
                queue.get_nowait()
            queue.put_nowait(None)

    def _publish(self, job_id: str) -> None:
        for queue in list(self._queues):
            try:
                queue.put_nowait(job_id)
            except asyncio.QueueFull:
                # Fallen behind: what it missed is replaced by one "re-read everything".
                while not queue.empty():
                    queue.get_nowait()
                queue.put_nowait(RESYNC)

    async def _follow(self) -> None:
        first = True
        while True:
            try:
                changes = self._cluster.changes()
                if changes is not None:
                    async with changes as feed:
                        self._subscribed(first)
                        async for job_id in feed:
                            self._publish(job_id)
                else:
                    await self._poll_list(first)
            except DispatchError as exc:  # the feed lost its source: subscribe again, re-read
                _log.info("ui: the store's change feed stopped (%s); subscribing again", exc)
            except Exception as exc:  # a defect below us must not end the pages' live updates for good
                _log.warning(
                    "ui: the store's change feed failed (%s: %s); subscribing again", type(exc).__name__, exc
                )
            first = False
            await asyncio.sleep(RETRY)

    def _subscribed(self, first: bool) -> None:
        self._ready.set()
        if not first:
            self._publish(RESYNC)

    async def _poll_list(self, first: bool) -> None:
        seen = {r.job_id: r.revision for r in await self._cluster.records()}
        self._subscribed(first)
        while True:
            await asyncio.sleep(self._poll)
            now = {r.job_id: r.revision for r in await self._cluster.records()}
            for job_id in sorted(set(now) | set(seen)):
                if now.get(job_id) != seen.get(job_id):
                    self._publish(job_id)
            seen = now
