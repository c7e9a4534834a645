"""A small synchronous facade over :class:`dispatch.Cluster`, for scripts and notebooks.

>>> import dispatch.sync
>>> with dispatch.sync.open("memory", dispatch.Config(store=MemoryStore())) as cluster:
...     record = cluster.submit(spec)

Every call runs on a private event loop in a daemon thread, so it works the same from plain scripts
and from inside a running loop (Jupyter): the caller's loop is never re-entered or blocked by ours.
"""

from __future__ import annotations

import asyncio
import builtins
import threading
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

from dispatch.clock import Clock
from dispatch.cluster import Cluster
from dispatch.cluster import open as _open_async
from dispatch.config import Config
from dispatch.model import Capabilities, JobRecord, JobSpec, Policy, State, Transition

__all__ = ["SyncCluster", "open"]

T = TypeVar("T")


class _LoopThread:
    """One event loop running forever in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="dispatch-sync", daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            coro.close()
            raise RuntimeError("a SyncCluster method was called from its own event loop; use the async API")
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return fut.result()
        except KeyboardInterrupt:
            fut.cancel()
            raise

    def stop(self) -> None:
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def open(name: str, config: Config | None = None, *, clock: Clock | None = None) -> SyncCluster:
    """Open a cluster like :func:`dispatch.open`, for synchronous callers."""
    runner = _LoopThread()
    try:
        cluster = runner.run(_open_async(name, config, clock=clock))
    except BaseException:
        runner.stop()
        raise
    return SyncCluster(cluster, runner)


class SyncCluster:
    """The methods of :class:`~dispatch.Cluster`, blocking. A context manager; :meth:`close` closes the
    cluster and stops the private loop. Iterators (:meth:`watch`, :meth:`output`) yield as items arrive."""

    def __init__(self, cluster: Cluster, runner: _LoopThread) -> None:
        self.cluster = cluster
        self._runner = runner

    def __enter__(self) -> SyncCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the cluster and stop the loop thread. Idempotent."""
        if self._runner.loop.is_closed():
            return
        try:
            self._runner.run(self.cluster.close())
        finally:
            self._runner.stop()

    def __repr__(self) -> str:
        return f"Sync{self.cluster!r}"

    def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        return self._runner.run(self.cluster.capabilities(spec))

    def submit(
        self, spec: JobSpec, *, job_id: str | None = None, held: bool = False, policy: Policy | None = None
    ) -> JobRecord:
        return self._runner.run(self.cluster.submit(spec, job_id=job_id, held=held, policy=policy))

    def cancel(self, job_id: str) -> JobRecord:
        return self._runner.run(self.cluster.cancel(job_id))

    def hold(self, job_id: str) -> JobRecord:
        return self._runner.run(self.cluster.hold(job_id))

    def release(self, job_id: str) -> JobRecord:
        return self._runner.run(self.cluster.release(job_id))

    def resubmit(self, job_id: str, spec: JobSpec | None = None) -> JobRecord:
        return self._runner.run(self.cluster.resubmit(job_id, spec))

    def dry_run(self, spec: JobSpec, *, job_id: str | None = None, held: bool = False) -> Mapping[str, Any]:
        return self._runner.run(self.cluster.dry_run(spec, job_id=job_id, held=held))

    def get(self, job_id: str) -> JobRecord:
        return self._runner.run(self.cluster.get(job_id))

    def list(self, states: Iterable[State] | None = None) -> builtins.list[JobRecord]:
        return self._runner.run(self.cluster.list(states))

    def history(self, job_id: str) -> builtins.list[Transition]:
        return self._runner.run(self.cluster.history(job_id))

    def watch(self, job_id: str | None = None) -> Iterator[JobRecord]:
        return self._iterate(self.cluster.watch(job_id))

    def output(
        self,
        job_id: str,
        *,
        node: int = 0,
        follow: bool = False,
        tail: int | None = None,
        previous: bool = False,
    ) -> Iterator[str]:
        return self._iterate(
            self.cluster.output(job_id, node=node, follow=follow, tail=tail, previous=previous)
        )

    def _iterate(self, agen: Any) -> Iterator[Any]:
        async def step() -> tuple[bool, Any]:
            try:
                return True, await agen.__anext__()
            except StopAsyncIteration:
                return False, None

        try:
            while True:
                more, item = self._runner.run(step())
                if not more:
                    return
                yield item
        finally:
            if not self._runner.loop.is_closed():
                self._runner.run(agen.aclose())
