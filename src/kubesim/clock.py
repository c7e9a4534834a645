"""Clocks for the simulator: a manual clock for deterministic tests and a (sped-up) real clock for demos.

Every timestamp kubesim writes (creationTimestamp, deletionTimestamp, condition times) comes from a
``Clock`` so tests can move time explicitly instead of sleeping.

Two time lines: *simulated* time (``now()``, timers, every duration a controller waits) and *wall* time
(what a timestamp a person reads says). A sped-up clock shortens waits, not ages: a timestamp is written
as the wall instant at which that simulated instant happens (``stamp``), and read back into simulated
time (``unstamp``), so a job created 17 real minutes ago is 17 minutes old in ``kubectl get`` at any
speed, while its 60-second deadline passes after 12 real seconds at speed x5 (docs/kubesim.md, Clocks).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

__all__ = [
    "Clock",
    "ManualClock",
    "RealClock",
    "TimerHandle",
    "parse_rfc3339",
    "rfc3339",
    "stamp",
    "unstamp",
]


class TimerHandle:
    """A scheduled callback; ``cancel()`` prevents it from running (idempotent)."""

    __slots__ = ("_cancelled", "_on_cancel")

    def __init__(self, on_cancel: Callable[[], None] | None = None) -> None:
        self._cancelled = False
        self._on_cancel = on_cancel

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self) -> None:
        if self._cancelled:
            return
        self._cancelled = True
        if self._on_cancel is not None:
            self._on_cancel()
            self._on_cancel = None


class Clock(Protocol):
    """What the simulator needs from time."""

    def now(self) -> float:
        """Seconds since the epoch (simulated)."""
        ...

    def call_at(self, when: float, fn: Callable[[], None]) -> TimerHandle:
        """Run ``fn`` (on the simulator's loop) once simulated time reaches ``when``."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of simulated time."""
        ...

    def wall(self, t: float) -> float:
        """The wall-clock instant (epoch seconds) at which simulated instant ``t`` happens."""
        ...

    def simulated(self, wall: float) -> float:
        """The simulated instant that happens at wall-clock instant ``wall`` (inverse of ``wall``)."""
        ...


class ManualClock:
    """A clock that only moves when told to: ``advance(seconds)`` fires due timers in time order."""

    def __init__(self, start: float = 1_767_225_600.0) -> None:
        self._now = float(start)
        self._seq = itertools.count()
        # (when, seq, handle, fn); seq keeps insertion order among equal times.
        self._timers: list[tuple[float, int, TimerHandle, Callable[[], None]]] = []

    def __repr__(self) -> str:
        return f"ManualClock(now={rfc3339(self._now)!r}, timers={len(self._timers)})"

    def now(self) -> float:
        return self._now

    def call_at(self, when: float, fn: Callable[[], None]) -> TimerHandle:
        handle = TimerHandle()
        heapq.heappush(self._timers, (float(when), next(self._seq), handle, fn))
        return handle

    def wall(self, t: float) -> float:
        return t  # a manual clock's time is the only time line: tests read what they advanced

    def simulated(self, wall: float) -> float:
        return wall

    def pending_timers(self) -> int:
        """Number of timers not yet fired or cancelled."""
        return sum(1 for _, _, h, _ in self._timers if not h.cancelled)

    def next_timer(self) -> float | None:
        """When the earliest live timer is due, or None."""
        while self._timers and self._timers[0][2].cancelled:
            heapq.heappop(self._timers)
        return self._timers[0][0] if self._timers else None

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` firing each due timer at its own time, in order.

        Timers scheduled by a firing callback are honoured if they fall inside the window.
        """
        if seconds < 0:
            raise ValueError(f"ManualClock.advance: seconds must be >= 0, got {seconds}")
        target = self._now + seconds
        while self._timers and self._timers[0][0] <= target:
            when, _, handle, fn = heapq.heappop(self._timers)
            if handle.cancelled:
                continue
            self._now = max(self._now, when)
            handle.cancel()  # mark as done so cancel() later is a no-op
            fn()
        self._now = target

    async def sleep(self, seconds: float) -> None:
        """Wait until someone advances the clock past now + seconds."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        def wake() -> None:
            if not fut.done():
                fut.set_result(None)

        handle = self.call_at(self._now + seconds, wake)
        try:
            await fut
        finally:
            handle.cancel()


class RealClock:
    """Wall-clock time, optionally sped up: ``speed=10`` makes 10 simulated seconds per real second.

    Simulated time starts at the real current time when the clock is created.
    """

    def __init__(self, speed: float = 1.0) -> None:
        if speed <= 0:
            raise ValueError(f"RealClock: speed must be > 0, got {speed}")
        self.speed = float(speed)
        self._origin_real = time.time()
        self._origin_mono = time.monotonic()

    def __repr__(self) -> str:
        return f"RealClock(speed={self.speed})"

    def now(self) -> float:
        return self._origin_real + (time.monotonic() - self._origin_mono) * self.speed

    def call_at(self, when: float, fn: Callable[[], None]) -> TimerHandle:
        loop = asyncio.get_running_loop()
        delay = max(0.0, (when - self.now()) / self.speed)
        th = loop.call_later(delay, fn)
        return TimerHandle(th.cancel)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds / self.speed))

    def wall(self, t: float) -> float:
        return self._origin_real + (t - self._origin_real) / self.speed

    def simulated(self, wall: float) -> float:
        return self._origin_real + (wall - self._origin_real) * self.speed


def rfc3339(t: float) -> str:
    """Format epoch seconds as Kubernetes does: ``2026-01-01T00:00:00Z`` (whole seconds, UTC)."""
    return datetime.fromtimestamp(int(t), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def stamp(clock: Clock, t: float) -> str:
    """The timestamp written for simulated instant ``t``: its wall-clock time, RFC 3339."""
    return rfc3339(clock.wall(t))


def unstamp(clock: Clock, text: str) -> float:
    """The simulated instant a written timestamp stands for (ValueError if it is not RFC 3339). Whole
    seconds of wall time: at speed x5 a value read back may be up to 5 simulated seconds early."""
    return clock.simulated(parse_rfc3339(text))


def parse_rfc3339(s: str) -> float:
    """Parse an RFC 3339 timestamp (``Z`` or offset, optional fraction) to epoch seconds."""
    text = s.strip()
    if text.endswith("Z") or text.endswith("z"):
        text = text[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError as exc:
        raise ValueError(f"not an RFC 3339 timestamp: {s!r}") from exc
