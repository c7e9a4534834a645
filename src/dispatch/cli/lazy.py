"""A backend opened on first use, for read commands: what the store already answers costs no adapter.

``dispatch status`` of a finished job, ``history``, ``describe`` and ``list`` when every job has ended are
answered from the records alone (:meth:`dispatch.Cluster.get` never asks the cluster about a terminal
record), so importing and connecting the adapter — most of a read command's CPU — is deferred until a
call needs the cluster. Only for read-only opening: a write opens the adapter up front, so that its probe
and its refusals come before anything is recorded.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from dispatch.backend import Backend, Holder, HoldToken, OutputReader, Prepared, Watcher
from dispatch.errors import UnavailableError, UnsupportedError
from dispatch.model import Absent, Capabilities, Change, Handle, Identity, JobSpec, Observation, Share

__all__ = ["LazyBackend"]


class LazyBackend:
    """Stands for the backend ``open`` returns, opening it on the first call that needs the cluster.

    It offers ``watch``, ``output``, ``hold`` and ``release`` so that :class:`dispatch.Cluster` finds them;
    whether they work is the real backend's capabilities' say (which the cluster reads first)."""

    def __init__(self, name: str, open: Callable[[], Awaitable[Backend]]) -> None:
        self._name = name
        self._open = open
        self._backend: Backend | None = None

    @property
    def name(self) -> str:
        return self._backend.name if self._backend is not None else self._name

    @property
    def cluster_id(self) -> str:
        if self._backend is None:  # dispatch.Cluster opens it (capabilities) before it asks
            raise UnavailableError(f"the {self._name} cluster is not opened yet: its identity is not known")
        return self._backend.cluster_id

    async def _real(self) -> Backend:
        if self._backend is None:
            self._backend = await self._open()
        return self._backend

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        return await (await self._real()).capabilities(spec)

    async def prepare(self, spec: JobSpec, identity: Identity, *, held: bool = False) -> Prepared:
        return await (await self._real()).prepare(spec, identity, held=held)

    async def start(self, prepared: Prepared) -> Handle:
        return await (await self._real()).start(prepared)

    async def observe(self, handle: Handle) -> Observation | Absent:
        return await (await self._real()).observe(handle)

    async def stop(self, handle: Handle) -> None:
        await (await self._real()).stop(handle)

    async def list(self) -> list[Observation]:
        return await (await self._real()).list()

    async def hold(self, handle: Handle) -> HoldToken:
        backend = await self._real()
        if not isinstance(backend, Holder):
            raise UnsupportedError(f"cluster {backend.name!r} cannot hold jobs (capability 'holds')")
        return await backend.hold(handle)

    async def release(self, handle: Handle, token: HoldToken) -> None:
        backend = await self._real()
        if not isinstance(backend, Holder):
            raise UnsupportedError(f"cluster {backend.name!r} cannot hold jobs (capability 'holds')")
        await backend.release(handle, token)

    async def watch(self, cursor: str | None = None, *, share: Share | None = None) -> AsyncIterator[Change]:
        backend = await self._real()
        if not isinstance(backend, Watcher):
            raise UnsupportedError(f"cluster {backend.name!r} cannot watch (capability 'watch')")
        async for change in backend.watch(cursor, share=share):
            yield change

    async def output(self, handle: Handle, **options: Any) -> AsyncIterator[str]:
        # The options as the cluster gives them (``previous`` only when asked): unchanged to the backend.
        backend = await self._real()
        if not isinstance(backend, OutputReader):
            raise UnsupportedError(f"cluster {backend.name!r} cannot read job output (capability 'output')")
        async for line in backend.output(handle, **options):
            yield line

    async def close(self) -> None:
        if self._backend is not None:
            await self._backend.close()
