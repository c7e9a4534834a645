"""The watch a supervisor keeps open: :class:`WatchFeed` (what :meth:`Supervisor.run` reads changes from)."""

from __future__ import annotations

import asyncio
import builtins
import logging
from collections.abc import AsyncIterator, Callable

from dispatch import health
from dispatch.backend import Backend, Watcher
from dispatch.clock import Clock
from dispatch.errors import DispatchError, UnsupportedError
from dispatch.model import Change, Share

__all__ = ["WatchFeed", "aclose", "drain"]

log = logging.getLogger("dispatch.supervise")

_FEED_PAUSE = 0.5
_FEED_PAUSE_MAX = 30.0


class WatchFeed:
    """One watch kept open: a task reads it into a buffer that :meth:`take` empties (only the changes
    ``keep`` accepts, when given: the others are read past, the cursor moving on). When the watch ends
    or drops, it is opened again from the last change's cursor (the kopf ``continuous_watch`` model),
    after a doubling pause (0.5 s to 30 s) when it failed. ``share``: only the changes of the jobs in it
    are asked for (:meth:`follow` moves it)."""

    def __init__(
        self,
        backend: Watcher,
        cursor: str | None,
        clock: Clock,
        *,
        keep: Callable[[Change], bool] | None = None,
        share: Share | None = None,
    ) -> None:
        self.cursor = cursor
        """The cursor of the last change read (kept or not)."""
        self._backend = backend
        self._clock = clock
        self._keep = keep
        self._share = share
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

    def follow(self, share: Share | None) -> None:
        """Watch the jobs of ``share`` (``None``: every job) from now on: when it is not the share
        watched, the watch is opened again from the last change's cursor, which replays what came after
        it for the jobs the new share adds."""
        if share == self._share:
            return
        self._share = share
        self._task.cancel()
        self._task = asyncio.get_running_loop().create_task(self._read(), name="dispatch-watch-feed")

    async def _read(self) -> None:
        quiet = 0  # watches in a row that failed, or ended without a change
        while True:
            changes = (
                self._backend.watch(self.cursor)
                if self._share is None
                else self._backend.watch(self.cursor, share=self._share)
            )
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
                await aclose(changes)
            # A watch that delivered and then ended (a server timeout) is resumed at once.
            quiet = quiet + 1 if failed or not delivered else 0
            await self._clock.sleep(min(_FEED_PAUSE * 2 ** (quiet - 1), _FEED_PAUSE_MAX) if quiet else 0.0)

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def aclose(changes: AsyncIterator[Change]) -> None:
    """Close a watch's stream, if it can be closed; a failure to close it changes nothing."""
    aclose = getattr(changes, "aclose", None)
    if aclose is not None:
        try:
            await aclose()
        except (DispatchError, RuntimeError):
            pass


async def drain(
    backend: Backend, cursor: str | None, share: Share | None
) -> tuple[builtins.list[Change], str | None]:
    """Every change a fresh watch from ``cursor`` has now (of ``share``'s jobs, when given), and the
    cursor to resume from; stops at the first wait (``Supervisor.step`` without a kept watch)."""
    if not isinstance(backend, Watcher):
        raise UnsupportedError(f"backend {backend.name!r} has no watch")
    out: builtins.list[Change] = []
    changes = backend.watch(cursor) if share is None else backend.watch(cursor, share=share)
    try:
        while True:
            try:
                async with asyncio.timeout(0):
                    change = await anext(changes)
            except (TimeoutError, StopAsyncIteration):
                break
            out.append(change)
            cursor = change.cursor
    except DispatchError as exc:  # a dropped watch: resume from the cursor next time
        log.info("watch interrupted: %s", exc)
    finally:
        await aclose(changes)
    return out, cursor
