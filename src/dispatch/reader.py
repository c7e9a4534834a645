"""The one way the host reads an incarnation: :class:`Reader` (shared by ``Cluster`` and ``Supervisor``).

A backend's ``observe`` gives a seen :class:`~dispatch.model.Observation` or an
:class:`~dispatch.model.Absent`, and raises for an answer it cannot trust. The reader turns that into a
typed reading, in one place:

- an error of the cluster's (``UnavailableError``, a lost answer, a timeout) is
  :class:`~dispatch.model.Unreachable` — it changes no record, and the reader remembers since when the
  cluster has been unreachable (:attr:`Reader.unreachable`) until a read succeeds again;
- an absent reading is only returned once a second, complete answer agrees: a fresh listing of the
  cluster that does not show the incarnation either (else the listed observation is returned) — only
  two absent readings may conclude ``lost``.
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import Awaitable, Callable
from typing import TypeVar

from dispatch import decide
from dispatch.backend import Backend
from dispatch.clock import Clock
from dispatch.errors import (
    BusyError,
    OutcomeUnknownError,
    PermissionDeniedError,
    UnavailableError,
)
from dispatch.model import Absent, Handle, Identity, JobRecord, Observation, Unreachable

__all__ = ["READ_TIMEOUT", "Reader"]

READ_TIMEOUT = 120.0
"""Seconds one read of the cluster may take before it counts as unreachable (a hang is no answer)."""

T = TypeVar("T")

UNREACHABLE_ERRORS = (UnavailableError, OutcomeUnknownError, BusyError, PermissionDeniedError, TimeoutError)
"""The errors of a read that say nothing about the incarnation: the cluster did not answer (or not
with the truth: a refused read is no evidence that a job is gone)."""


class Reader:
    """Reads incarnations of one backend for one process (see the module docstring)."""

    def __init__(self, backend: Backend, clock: Clock) -> None:
        self.backend = backend
        self.clock = clock
        self.unreachable: Unreachable | None = None
        """Since when, and why, the cluster has not answered (``None``: its last read succeeded)."""
        self._index: tuple[builtins.list[Observation], dict[tuple[str, int, str], Observation]] | None = None

    def note(self, exc: BaseException, handle: Handle | None = None) -> Unreachable | None:
        """The unreachable reading error ``exc`` stands for, remembered (since the first failure, why the
        latest); ``None`` when the error says something else (a bug, a refused request)."""
        if not isinstance(exc, UNREACHABLE_ERRORS):
            return None
        at = self.clock.now()
        reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        since = self.unreachable.at if self.unreachable is not None else at
        self.unreachable = Unreachable(at=since, reason=reason, handle=handle)
        return Unreachable(at=at, reason=reason, handle=handle)

    def answered(self) -> None:
        """The cluster answered: it is reachable again."""
        self.unreachable = None

    async def _ask(self, call: Callable[[], Awaitable[T]], handle: Handle | None = None) -> T | Unreachable:
        try:
            async with asyncio.timeout(READ_TIMEOUT):
                result = await call()
        except UNREACHABLE_ERRORS as exc:
            noted = self.note(exc, handle)
            assert noted is not None
            return noted
        self.answered()
        return result

    async def listing(self) -> builtins.list[Observation] | Unreachable:
        """Every incarnation the cluster lists (a complete answer), or why there is none."""
        return await self._ask(self.backend.list)

    async def observe(self, handle: Handle) -> Observation | Absent | Unreachable:
        """One reading of ``handle`` (an absent one not yet confirmed: see :meth:`confirm`)."""
        return await self._ask(lambda: self.backend.observe(handle), handle)

    async def confirm(
        self, absent: Absent, listing: builtins.list[Observation] | None = None
    ) -> Observation | Absent | Unreachable:
        """The second reading of an incarnation read absent: a complete listing (``listing``, when the
        caller has a fresh one) that shows it gives its observation; one that does not confirms the
        absence."""
        listed = listing if listing is not None else await self.listing()
        if isinstance(listed, Unreachable):
            return listed
        found = self.listed(absent.handle.identity, listed)
        return found if found is not None else absent

    async def read(
        self, record: JobRecord, listing: builtins.list[Observation] | None = None
    ) -> Observation | Absent | Unreachable | None:
        """The reading of the record's current incarnation: by its handle, else (a start whose effect is
        unknown) by its identity in a listing. An absent reading comes back only confirmed. ``None``:
        the record has no incarnation to read (not placed; or placed nowhere that a listing shows)."""
        handle = decide.current_handle(record)
        if handle is not None:
            got = await self.observe(handle)
            if isinstance(got, Absent):
                return await self.confirm(got, listing)
            return got
        if record.unknown_write is not None:
            return await self.find(record, listing)
        return None

    async def find(
        self, record: JobRecord, listing: builtins.list[Observation] | None = None
    ) -> Observation | Unreachable | None:
        """The listed observation of the record's current incarnation (by identity), if any."""
        listed = listing if listing is not None else await self.listing()
        if isinstance(listed, Unreachable):
            return listed
        return self.listed(record.identity, listed)

    def listed(self, identity: Identity, listing: builtins.list[Observation]) -> Observation | None:
        """The first observation in ``listing`` of ``identity``'s incarnation (same job id, ``N`` and
        nonce), looked up in an index of the listing kept until another listing is asked about: a
        supervisor's poll asks this for every record placed nowhere yet, and a scan of the listing each
        would be quadratic."""
        if self._index is None or self._index[0] is not listing:
            first: dict[tuple[str, int, str], Observation] = {}
            for obs in listing:
                ident = obs.handle.identity
                first.setdefault((ident.job_id, ident.epoch.n, ident.nonce), obs)
            self._index = (listing, first)
        return self._index[1].get((identity.job_id, identity.epoch.n, identity.nonce))
