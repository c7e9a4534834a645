"""What the operator and the observer of an opened cluster share: :class:`ClusterBase`.

The backend, the store and the clock; the one :class:`~dispatch.reader.Reader` through which the cluster
is read and the one :class:`~dispatch.writer.RecordWriter` through which records are written; whether a
record is this cluster's; and a record refreshed from the cluster (:meth:`ClusterBase.get`), which both
an operator's write and an observer's read start from.
"""

from __future__ import annotations

import random

from dispatch import chance
from dispatch.backend import Backend
from dispatch.clock import Clock, SystemClock
from dispatch.errors import DispatchError, ReadOnlyError
from dispatch.fold import folded
from dispatch.model import DEFAULT_POLICY, Absent, Capabilities, JobRecord, Observation, Policy, Unreachable
from dispatch.reader import Reader
from dispatch.records import Store
from dispatch.writer import Change as RecordChange
from dispatch.writer import RecordWriter

__all__ = ["POLL_MAX", "POLL_MIN", "ClusterBase"]

POLL_MIN = 0.5
POLL_MAX = 5.0
"""Polling backoff of :meth:`Cluster.watch` on a backend without a watcher, and of
:meth:`Cluster.resubmit` waiting for compute to go on a backend without a cessation signal (seconds)."""


class ClusterBase:
    """The parts of :class:`~dispatch.cluster.Cluster` its operator and observer share (see the module
    docstring)."""

    def __init__(
        self,
        backend: Backend,
        store: Store,
        *,
        policy: Policy = DEFAULT_POLICY,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.backend = backend
        self.store = store
        self.policy = policy
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.rng = chance.source(rng)
        self._writer = RecordWriter(store, backend, self.clock)
        self._reader = Reader(backend, self.clock)
        self._closed = False

    @property
    def unreachable(self) -> Unreachable | None:
        """Since when, and why, this process has not been able to read the cluster (``None``: its last
        read succeeded). While it lasts, reads answer with the records as last stored."""
        return self._reader.unreachable

    @property
    def cluster_id(self) -> str:
        """The identity of the opened cluster (see :attr:`dispatch.backend.Backend.cluster_id`)."""
        return self.backend.cluster_id

    def owns(self, record: JobRecord) -> bool:
        """Whether ``record`` belongs to this cluster, so that this process may change it (SPEC §6.1)."""
        return self._writer.owns(record)

    async def belongs(self, record: JobRecord) -> bool:
        """:meth:`owns`, for any backend: one opened on first use (the CLI's read commands) is opened
        first, since it knows its cluster only then. ``False`` when that cluster cannot be reached to be
        opened (:attr:`unreachable` then says since when and why): its records are shown as last known."""
        try:
            await self.backend.capabilities()
        except DispatchError as exc:
            if self._reader.note(exc) is None:
                raise
            return False
        return self.owns(record)

    async def _check_writable(self) -> Capabilities:
        caps = await self.backend.capabilities()
        if caps.read_only or caps.observe_only:
            mode = "read-only" if caps.read_only else "observe-only"
            why = "".join(f"; {n.split(': ', 1)[1]}" for n in caps.notes if n.startswith(f"{mode}: "))
            raise ReadOnlyError(f"cluster {self.backend.name!r} is {mode}: it accepts no writes{why}")
        return caps

    async def get(self, job_id: str) -> JobRecord:
        """The job's record, refreshed from the cluster when it is not terminal. While the cluster does
        not answer, the record as last stored (:attr:`unreachable` says since when and why)."""
        rec = await self.store.get(job_id)
        if rec.outcome.terminal or not await self.belongs(rec):
            return rec  # final, or another cluster's: shown as last known
        got = await self._reader.read(rec)
        if got is None or isinstance(got, Unreachable):
            return rec
        return await self._fold(job_id, got, confirmed=True)

    async def _fold(
        self, job_id: str, reading: Observation | Absent, *, confirmed: bool = False
    ) -> JobRecord:
        """Fold a reading into the record (``confirmed``: an absent one was read twice)."""
        return await self._update(
            job_id, lambda r: folded(r, reading, now=self.clock.now(), confirmed=confirmed)
        )

    async def _update(self, job_id: str, change: RecordChange) -> JobRecord:
        """The one compare-and-swap loop (:meth:`RecordWriter.update`)."""
        return await self._writer.update(job_id, change)
