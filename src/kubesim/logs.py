"""Container logs of simulated pods: the kubelet side appends lines, the API server streams them.

Lines are kept per (namespace, pod, container) until the pod object is deleted (``forget``), so a
``GET .../log`` after the pod is gone is a 404 like on a real cluster.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from kubesim.clock import Clock

__all__ = ["LogLine", "PodLogs"]

_MAX_LINES = 100_000  # per container; older lines are dropped (a kubelet rotates logs too)


@dataclass(frozen=True)
class LogLine:
    """One line with the simulated time it was written."""

    time: float
    text: str


@dataclass
class _Stream:
    lines: list[LogLine] = field(default_factory=list)
    dropped: int = 0  # lines rotated away (keeps follower offsets stable)
    closed: bool = False
    waiters: list[asyncio.Future[None]] = field(default_factory=list)

    def wake(self) -> None:
        waiters, self.waiters = self.waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


class PodLogs:
    """Log lines per container, with followers that see new lines as they are appended."""

    def __init__(self, clock: Clock | None = None) -> None:
        self._clock = clock
        # (namespace, pod) -> container -> stream, so forgetting a pod touches only its own streams
        self._pods: dict[tuple[str, str], dict[str, _Stream]] = {}
        self._previous: dict[tuple[str, str, str], list[LogLine]] = {}
        self._stopping = False

    def __repr__(self) -> str:
        return f"PodLogs(pods={len(self._pods)})"

    def _stream(self, namespace: str, pod: str, container: str) -> _Stream:
        containers = self._pods.setdefault((namespace, pod), {})
        s = containers.get(container)
        if s is None:
            s = containers[container] = _Stream()
        return s

    def _get(self, namespace: str, pod: str, container: str) -> _Stream | None:
        return self._pods.get((namespace, pod), {}).get(container)

    def append(self, namespace: str, pod: str, container: str, line: str) -> None:
        """Append one line (a trailing newline is implied; embedded newlines make several lines)."""
        s = self._stream(namespace, pod, container)
        now = self._clock.wall(self._clock.now()) if self._clock is not None else 0.0
        for part in line.rstrip("\n").split("\n"):
            s.lines.append(LogLine(now, part))
        if len(s.lines) > _MAX_LINES:
            extra = len(s.lines) - _MAX_LINES
            del s.lines[:extra]
            s.dropped += extra
        s.closed = False
        s.wake()

    def close(self, namespace: str, pod: str, container: str) -> None:
        """The container terminated: followers get the remaining lines and end."""
        s = self._stream(namespace, pod, container)
        s.closed = True
        s.wake()

    def reopen(self, namespace: str, pod: str, container: str) -> None:
        """The container (re)started: mark the stream live again."""
        self._stream(namespace, pod, container).closed = False

    def restart(self, namespace: str, pod: str, container: str) -> None:
        """The kubelet restarted the container: its lines so far become the previous instance's
        (``?previous=true``) and a fresh, live stream begins. Followers of the old instance end."""
        containers = self._pods.setdefault((namespace, pod), {})
        old = containers.get(container)
        if old is not None:
            old.closed = True
            old.wake()
            self._previous[(namespace, pod, container)] = old.lines
        containers[container] = _Stream()

    def previous(self, namespace: str, pod: str, container: str) -> list[LogLine] | None:
        """The previous instance's lines, or None if the container never restarted."""
        return self._previous.get((namespace, pod, container))

    def is_closed(self, namespace: str, pod: str, container: str) -> bool:
        s = self._get(namespace, pod, container)
        return s is None or s.closed

    def has(self, namespace: str, pod: str, container: str) -> bool:
        return self._get(namespace, pod, container) is not None

    def lines(self, namespace: str, pod: str, container: str) -> list[str]:
        """All retained lines of one container (without newlines)."""
        s = self._get(namespace, pod, container)
        return [ln.text for ln in s.lines] if s else []

    def entries(self, namespace: str, pod: str, container: str) -> list[LogLine]:
        s = self._get(namespace, pod, container)
        return list(s.lines) if s else []

    def forget(self, namespace: str, pod: str) -> None:
        """The pod object is gone: drop its logs and end its followers."""
        for container, s in self._pods.pop((namespace, pod), {}).items():
            s.closed = True
            s.wake()
            self._previous.pop((namespace, pod, container), None)

    def end_followers(self) -> None:
        """End every follower now (the server is shutting down); the lines are kept."""
        self._stopping = True
        for containers in self._pods.values():
            for s in containers.values():
                s.wake()

    async def follow(
        self,
        namespace: str,
        pod: str,
        container: str,
        *,
        tail: int | None = None,
        since: float | None = None,
    ) -> AsyncIterator[LogLine]:
        """Yield retained lines (the last ``tail``, those at/after ``since``), then new ones until the
        container is closed or the pod forgotten."""
        s = self._stream(namespace, pod, container)
        start = 0
        if since is not None:
            while start < len(s.lines) and s.lines[start].time < since:
                start += 1
        if tail is not None:
            start = max(start, len(s.lines) - max(tail, 0))
        pos = s.dropped + start  # absolute line number
        while True:
            if self._get(namespace, pod, container) is not s:
                return
            while pos - s.dropped < len(s.lines):
                idx = max(pos - s.dropped, 0)
                pos = s.dropped + idx + 1
                yield s.lines[idx]
            if s.closed or self._stopping:
                return
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            s.waiters.append(fut)
            await fut
