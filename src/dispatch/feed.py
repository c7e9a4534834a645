"""The host's watch feed: :class:`Feed` (SPEC §5, "The host owns the feed").

One feed per opened backend keeps the last reading of each incarnation, emits a
:class:`~dispatch.model.Change` only when that reading really changes, fans the changes out to every
watcher of the process (all jobs, or one job at the cost of that job), and hands out cursors that resume
— after a reconnect, an expired cursor, a failed source, or in a new process — through one path: a
cursor this feed still holds replays what came after it; any other cursor relists (the current reading
of every incarnation, which the host's fold takes as it takes any reading).

An adapter only *fills* it: its ``fill`` coroutine (Kubeflow: the informer's list+watch streams; Slurm:
its polls; memory: the cluster's change log) calls :meth:`Feed.offer` with each reading it makes and
runs until cancelled, or raises to say the source failed. No adapter keeps its own memory of what it
emitted, nor its own subscribers or cursors.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import logging
import os
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable

from dispatch.errors import DispatchError, InvalidError, UnavailableError
from dispatch.model import Absent, Change, Compute, Observation, Share, Unreachable

__all__ = ["ENDED", "HISTORY", "CatchUp", "Feed", "Fill"]

_log = logging.getLogger("dispatch.feed")

HISTORY = 10_000
"""How many changes a feed keeps for resuming from a cursor (older cursors relist)."""
ENDED = 10_000
"""How many ended incarnations (absent, or ended with no compute left) a feed remembers."""

Fill = Callable[["Feed"], Awaitable[None]]
"""An adapter's source of readings: offers them to the feed and runs until cancelled."""
CatchUp = Callable[["Feed"], None]
"""An adapter's way to bring the feed up to date at once, when its source can be read without waiting
(the memory cluster's log): called when a watch opens, so it starts from the present."""

_ids = itertools.count(1)
_RELIST = "relist"

Item = Observation | Absent
_Notice = tuple[int, Change] | DispatchError


def _same(a: Item | None, b: Item) -> bool:
    """Whether reading ``b`` says nothing new after ``a`` (its time aside)."""
    if a is None or type(a) is not type(b):
        return False
    if isinstance(a, Observation) and isinstance(b, Observation):
        return a.outcome == b.outcome and a.compute == b.compute and a.handle == b.handle
    return a.handle == b.handle


def _ended(reading: Item) -> bool:
    if isinstance(reading, Absent):
        return True
    return reading.outcome.terminal and reading.compute is not Compute.PRESENT


class Feed:
    """The watch of one opened backend (see the module docstring).

    ``fill`` is started by the first watcher and, with ``idle_stop``, cancelled when the last one leaves
    (a poller that costs commands polls only while someone watches). ``history`` changes are kept for
    resuming; ``ended`` ended incarnations are remembered (bounded memory over a long-lived process).
    ``current`` says whether the readings held are current (:meth:`current`)."""

    def __init__(
        self,
        fill: Fill,
        *,
        catch_up: CatchUp | None = None,
        idle_stop: bool = False,
        history: int = HISTORY,
        ended: int = ENDED,
        current: Callable[[], bool] | None = None,
    ) -> None:
        self.id = f"{os.getpid():x}.{next(_ids)}"
        self._fill = fill
        self._catch_up = catch_up
        self._current = current
        self._idle_stop = idle_stop
        self._last: dict[str, Item] = {}
        self._ended: OrderedDict[str, None] = OrderedDict()
        self._ended_max = ended
        self._seq = 0
        self._history: deque[tuple[int, Change]] = deque(maxlen=history)
        self._all: dict[asyncio.Queue[_Notice], Share | None] = {}  # watcher -> its share (None: all)
        self._jobs: dict[str, set[asyncio.Queue[_Notice]]] = {}
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.trouble: Unreachable | None = None
        """Why the source could not read the cluster at its last attempt (``None``: it could)."""

    # --- what an adapter calls ------------------------------------------------------------------------

    def offer(self, reading: Item) -> Change | None:
        """One reading of an incarnation: emitted (and returned) when it differs from the last one."""
        key = reading.handle.ref
        if _same(self._last.get(key), reading):
            return None
        self._last[key] = reading
        if _ended(reading):
            self._ended.pop(key, None)
            self._ended[key] = None
            while len(self._ended) > self._ended_max:
                old, _ = self._ended.popitem(last=False)
                self._last.pop(old, None)
        else:
            self._ended.pop(key, None)
        self._seq += 1
        change = Change(reading, self._cursor(self._seq))
        self._history.append((self._seq, change))
        notice = (self._seq, change)
        job_id = reading.handle.identity.job_id
        for q, share in self._all.items():
            if share is None or share.holds(job_id):
                q.put_nowait(notice)
        for q in self._jobs.get(job_id, ()):
            q.put_nowait(notice)
        return change

    def troubled(self, trouble: Unreachable | None) -> None:
        """The source could not read the cluster (an :class:`~dispatch.model.Unreachable`), or could
        again (``None``). Nothing is emitted for it: an outage changes no reading."""
        self.trouble = trouble

    def last(self, ref: str) -> Item | None:
        """The last reading emitted for the incarnation of native reference ``ref``."""
        return self._last.get(ref)

    def readings(self) -> builtins.list[Item]:
        """The last reading of every incarnation this feed remembers."""
        return list(self._last.values())

    def current(self) -> bool:
        """Whether the readings this feed holds are as good as a new read of the cluster, as its source
        knows (``current``, given by the adapter: Slurm's polls when the last poll, or the submits since,
        are younger than the poll interval). Without it, never: a host that needs the present reads it."""
        return self._current is not None and self._current()

    # --- what the host calls --------------------------------------------------------------------------

    @property
    def cursor(self) -> str:
        """The cursor of the newest change (resuming from it emits what comes after)."""
        return self._cursor(self._seq)

    def watch(
        self, cursor: str | None = None, *, job_id: str | None = None, share: Share | None = None
    ) -> AsyncIterator[Change]:
        """Changes of every incarnation (of job ``job_id`` alone, or of the jobs in ``share``, when
        given): after ``cursor`` when this feed still holds it, else first the current reading of each
        incarnation, then every change. Raises the source's error when it fails (watch again to resume).
        A change outside the share wakes nobody: it is never queued for this watcher."""
        if cursor is not None and not isinstance(cursor, str):
            raise InvalidError(f"expected a cursor from a change, got {cursor!r}", path="cursor")
        if share is not None and not isinstance(share, Share):
            raise InvalidError(f"expected a Share, got {type(share).__name__}", path="share")
        return self._watch(cursor, job_id, share)

    async def _watch(
        self, cursor: str | None, job_id: str | None, share: Share | None
    ) -> AsyncIterator[Change]:
        self._ensure()
        if self._catch_up is not None:
            self._catch_up(self)
        queue: asyncio.Queue[_Notice] = asyncio.Queue()
        if job_id is None:
            self._all[queue] = share
        else:
            self._jobs.setdefault(job_id, set()).add(queue)
        try:
            head = self._seq

            def wanted(c: Change | Item) -> bool:
                jid = c.handle.identity.job_id
                return (job_id is None or jid == job_id) and (share is None or share.holds(jid))

            for change in self._start(cursor, wanted, head):
                yield change
            while True:
                notice = await queue.get()
                if isinstance(notice, DispatchError):
                    raise notice
                seq, change = notice
                if seq > head:
                    yield change
        finally:
            if job_id is None:
                self._all.pop(queue, None)
            else:
                subs = self._jobs.get(job_id, set())
                subs.discard(queue)
                if not subs:
                    self._jobs.pop(job_id, None)
            if self._idle_stop and not self._all and not self._jobs:
                self._stop()

    def _start(
        self, cursor: str | None, wanted: Callable[[Change | Item], bool], head: int
    ) -> builtins.list[Change]:
        """What a new watcher is given first: the changes after its cursor, or the current readings
        (only those ``wanted``)."""
        seq = self._position(cursor)
        oldest = self._history[0][0] if self._history else self._seq + 1
        if seq is not None and seq <= head and (seq + 1 >= oldest or seq == head):
            return [c for s, c in self._history if s > seq and wanted(c)]
        current = [r for r in self._last.values() if wanted(r)]
        # Only the last item resumes after the head: resuming from an earlier one relists again, or the
        # items after it would be lost.
        relist = f"{self.id}:{_RELIST}"
        return [
            Change(r, self._cursor(head) if i == len(current) - 1 else relist) for i, r in enumerate(current)
        ]

    def _position(self, cursor: str | None) -> int | None:
        if cursor is None:
            return None
        fid, _, seq = cursor.rpartition(":")
        if fid != self.id or not seq.isdigit():
            return None  # another feed's (another process, an older feed), or a relist: relist
        return int(seq)

    def _cursor(self, seq: int) -> str:
        return f"{self.id}:{seq}"

    # --- the source -----------------------------------------------------------------------------------

    def _ensure(self) -> None:
        loop = asyncio.get_running_loop()
        if self._task is not None and not self._task.done() and self._loop is loop:
            return
        self._loop = loop
        self._task = loop.create_task(self._run(), name=f"dispatch-feed-{self.id}")

    async def _run(self) -> None:
        try:
            await self._fill(self)
        except asyncio.CancelledError:
            raise
        except DispatchError as exc:
            self._fail(exc)
        except Exception as exc:
            # An adapter's bug, not an outage: said loudly, and every watcher is told the feed ended.
            _log.exception("the feed's source failed unexpectedly")
            self._fail(UnavailableError(f"the watch's source failed: {type(exc).__name__}: {exc}"))
        else:
            self._fail(UnavailableError("the watch's source ended"))

    def _fail(self, exc: DispatchError) -> None:
        for q in list(self._all):
            q.put_nowait(exc)
        for queues in self._jobs.values():
            for q in queues:
                q.put_nowait(exc)

    def _stop(self) -> None:
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()

    async def close(self) -> None:
        """Stop the source (the watchers' next read ends). Idempotent."""
        task, self._task = self._task, None
        if task is None or task.done():
            return
        if task.get_loop() is not asyncio.get_running_loop():
            if not task.get_loop().is_closed():
                task.get_loop().call_soon_threadsafe(task.cancel)
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
