"""What a supervisor reads of its cluster besides the watch: :class:`ClusterView`."""

from __future__ import annotations

import builtins

from dispatch import health
from dispatch.backend import Backend, Fed, Watcher, compute_gone
from dispatch.clock import Clock
from dispatch.model import Capabilities, Handle, JobRecord, Observation, Unreachable
from dispatch.reader import UNREACHABLE_ERRORS, Reader

__all__ = ["ClusterView"]


class ClusterView:
    """The cluster as one supervisor reads it: its capabilities (read once: they are per opened cluster),
    one listing shared by every lookup of a step until :meth:`forget_listing` (a poll looks up every
    record placed nowhere yet), and the :class:`~dispatch.reader.Reader` every single reading goes
    through."""

    def __init__(self, backend: Backend, clock: Clock) -> None:
        self.backend = backend
        self.reader = Reader(backend, clock)
        self._capabilities: Capabilities | None = None
        self._listing: builtins.list[Observation] | None = None

    @property
    def unreachable(self) -> Unreachable | None:
        """The supervisor's one account of whether its cluster answers: since when, and why, it has not
        (``None``: it does) — its own last listing or read failed (:attr:`Reader.unreachable`), or the
        feed's source could not read the cluster at its last attempt (:class:`~dispatch.backend.Fed`:
        a listing the adapter answers from its cache does not say the cluster answers), the earlier."""
        own = self.reader.unreachable
        trouble = self.backend.feed.trouble if isinstance(self.backend, Fed) else None
        if trouble is None or (own is not None and own.at <= trouble.at):
            return own
        return trouble

    async def caps(self) -> Capabilities:
        if self._capabilities is None:
            self._capabilities = await self.backend.capabilities()
        return self._capabilities

    async def watching(self) -> bool:
        """Whether changes come from a watch (else each record is polled)."""
        return isinstance(self.backend, Watcher) and (await self.caps()).watch

    def forget_listing(self) -> None:
        """The next :meth:`list` asks the cluster again (the one kept may predate a write or a stop)."""
        self._listing = None

    def keep_listing(self, listing: builtins.list[Observation]) -> None:
        """Use ``listing``, just read, for the next lookups."""
        self._listing = listing

    async def list(self) -> builtins.list[Observation]:
        """The listing kept for this step, or a new one (a cluster that does not answer raises)."""
        if self._listing is None:
            try:
                self._listing = await self.backend.list()
            except UNREACHABLE_ERRORS as exc:
                self.reader.note(exc)  # the supervisor's one account of whether its cluster answers
                raise
            self.reader.answered()
            health.current().mark("cluster")
        return self._listing

    async def fresh_listing(self) -> builtins.list[Observation]:
        self.forget_listing()
        return await self.list()

    async def find(self, rec: JobRecord) -> Observation | None:
        """The listed observation of the record's current incarnation (see
        :meth:`~dispatch.reader.Reader.listed`)."""
        return self.reader.listed(rec.identity, await self.list())

    async def gone(self, handle: Handle) -> bool:
        """True once no compute of the incarnation remains (see :func:`dispatch.backend.compute_gone`)."""
        return await compute_gone(
            self.backend, handle, cessation=(await self.caps()).cessation, listing=self.fresh_listing
        )
