"""What the conformance checks need from an adapter author: a :class:`Harness`.

A harness opens backends on one cluster (fresh per test), gives a job spec that cluster can run, makes
cluster events happen to a running job, and moves the cluster's time. :class:`BaseHarness` supplies
defaults; :class:`MemoryHarness` is the harness of the ``memory`` adapter (and an example).
"""

from __future__ import annotations

import asyncio
from typing import Protocol, runtime_checkable

from dispatch.backend import Backend
from dispatch.clock import ManualClock
from dispatch.memory import MemoryBackend, MemoryCluster, MemorySettings
from dispatch.model import Extensions, Handle, Image, JobSpec

__all__ = ["INJECTABLE", "BaseHarness", "Harness", "MemoryHarness"]

INJECTABLE = frozenset({"preempt", "lose_node", "oom", "evict", "fail", "succeed", "vanish", "outage"})
"""Names of the cluster events a harness may be able to cause (its ``injects`` is a subset)."""


@runtime_checkable
class Harness(Protocol):
    """The adapter-specific half of the conformance suite.

    Attributes:
        name: the name every backend it opens reports (``Backend.name``).
        injects: which of :data:`INJECTABLE` the hooks can do; a check needing another one is skipped.
        step: cluster seconds to move per :meth:`advance` while a check waits for a transition.
        patience: cluster seconds a check waits for a transition before it fails.
        lingers: whether compute stays a while after ``stop`` (so ``ceased`` is first false).
    """

    name: str
    injects: frozenset[str]
    step: float
    patience: float
    lingers: bool

    async def open(self, *, read_only: bool = False) -> Backend:
        """A backend on this harness's cluster (every call: the same cluster). The harness closes every
        backend it opened in :meth:`close`."""
        ...

    def spec(self) -> JobSpec:
        """A valid spec for this cluster (one node) whose job keeps running until an event is injected
        or it is stopped or held."""
        ...

    async def preempt(self, backend: Backend, handle: Handle) -> None:
        """The cluster's scheduler preempts the running job."""
        ...

    async def lose_node(self, backend: Backend, handle: Handle) -> None:
        """The node under the running job is lost."""
        ...

    async def oom(self, backend: Backend, handle: Handle) -> None:
        """The running job is killed for lack of memory."""
        ...

    async def evict(self, backend: Backend, handle: Handle) -> None:
        """The running job is evicted."""
        ...

    async def fail(self, backend: Backend, handle: Handle, exit_code: int) -> None:
        """The running job exits with ``exit_code`` (not 0)."""
        ...

    async def succeed(self, backend: Backend, handle: Handle) -> None:
        """The running job exits 0 on every node."""
        ...

    async def vanish(self, backend: Backend, handle: Handle) -> None:
        """The job's cluster object is deleted by someone else."""
        ...

    async def outage(self, backend: Backend, how: str | None) -> None:
        """Make the cluster stop answering (``how``: ``down``, ``partial``, ``errors``), or answer again
        (``None``); its jobs go on meanwhile."""
        ...

    async def advance(self, seconds: float) -> None:
        """Move the cluster's time forward and let it react."""
        ...

    async def settle(self) -> None:
        """Let pending work (controllers, watch streams, the checks' own tasks) run, without moving time."""
        ...

    async def close(self) -> None:
        """Close every backend opened and tear the cluster down."""
        ...


class BaseHarness:
    """Defaults for a harness: no events, 1 s steps, 120 s patience, lingering compute. Subclasses set
    ``name`` and ``injects`` and implement :meth:`open`, :meth:`spec`, :meth:`advance` and the hooks
    they list in ``injects``."""

    name = ""
    injects: frozenset[str] = frozenset()
    step = 1.0
    patience = 120.0
    lingers = True

    async def open(self, *, read_only: bool = False) -> Backend:
        raise NotImplementedError

    def spec(self) -> JobSpec:
        raise NotImplementedError

    async def preempt(self, backend: Backend, handle: Handle) -> None:
        raise NotImplementedError("preempt")

    async def lose_node(self, backend: Backend, handle: Handle) -> None:
        raise NotImplementedError("lose_node")

    async def oom(self, backend: Backend, handle: Handle) -> None:
        raise NotImplementedError("oom")

    async def evict(self, backend: Backend, handle: Handle) -> None:
        raise NotImplementedError("evict")

    async def fail(self, backend: Backend, handle: Handle, exit_code: int) -> None:
        raise NotImplementedError("fail")

    async def succeed(self, backend: Backend, handle: Handle) -> None:
        raise NotImplementedError("succeed")

    async def vanish(self, backend: Backend, handle: Handle) -> None:
        raise NotImplementedError("vanish")

    async def outage(self, backend: Backend, how: str | None) -> None:
        raise NotImplementedError("outage")

    async def advance(self, seconds: float) -> None:
        raise NotImplementedError

    async def settle(self) -> None:
        # Enough turns of the event loop for a woken watcher or waiter to run to its next await.
        for _ in range(50):
            await asyncio.sleep(0)

    async def close(self) -> None:
        return None


class MemoryHarness(BaseHarness):
    """The ``memory`` adapter's harness: one :class:`~dispatch.memory.MemoryCluster` on a
    :class:`~dispatch.clock.ManualClock`, every event injectable."""

    name = "memory"
    injects = INJECTABLE
    step = 1.0
    patience = 60.0
    lingers = True

    def __init__(self, settings: MemorySettings | None = None) -> None:
        self.clock = ManualClock()
        self.cluster = MemoryCluster(settings, clock=self.clock)
        self._opened: list[Backend] = []

    async def open(self, *, read_only: bool = False) -> Backend:
        backend = MemoryBackend(cluster=self.cluster, read_only=read_only)
        self._opened.append(backend)
        return backend

    def spec(self) -> JobSpec:
        return JobSpec(
            command=("python", "train.py"),
            env={"KUBESIM_SCRIPT": "print started on {rank}; hang"},
            extensions=Extensions([Image("registry.example.com/train:1")]),
        )

    async def preempt(self, backend: Backend, handle: Handle) -> None:
        await self._mem(backend).preempt(handle)

    async def lose_node(self, backend: Backend, handle: Handle) -> None:
        await self._mem(backend).lose_node(handle)

    async def oom(self, backend: Backend, handle: Handle) -> None:
        await self._mem(backend).oom(handle)

    async def evict(self, backend: Backend, handle: Handle) -> None:
        await self._mem(backend).evict(handle)

    async def fail(self, backend: Backend, handle: Handle, exit_code: int) -> None:
        await self._mem(backend).exit(handle, exit_code)

    async def succeed(self, backend: Backend, handle: Handle) -> None:
        await self._mem(backend).exit(handle, 0)

    async def vanish(self, backend: Backend, handle: Handle) -> None:
        await self._mem(backend).vanish(handle)

    async def outage(self, backend: Backend, how: str | None) -> None:
        self.cluster.outage(3600.0 if how is not None else 0.0, how or "down")

    async def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        await self.settle()

    async def close(self) -> None:
        for backend in self._opened:
            await backend.close()
        self._opened.clear()

    @staticmethod
    def _mem(backend: Backend) -> MemoryBackend:
        if not isinstance(backend, MemoryBackend):
            raise TypeError(f"the memory harness drives memory backends, got {type(backend).__name__}")
        return backend
