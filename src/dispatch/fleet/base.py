"""What a fleet's operator and observer share: :class:`FleetBase` — its clusters (:class:`Member`), opening
them, which one a record belongs to, and whether each answers.

Whether a cluster answers is kept in the store too (a note per cluster, written when that changes), so that
every process — a command run now, the supervisor that has run for a day — says since when one has not.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from dispatch.clock import Clock, SystemClock
from dispatch.cluster import Cluster
from dispatch.errors import DispatchError, InvalidError, OtherClusterError, UnavailableError
from dispatch.model import DEFAULT_POLICY, JobRecord, Policy, Unreachable
from dispatch.records import KeyValues, Store

from .placer import PATIENCE, Placer, Seat

__all__ = ["DOWN_KEY", "IDENTITY_KEY", "REOPEN", "FleetBase", "Member"]

REOPEN = 15.0
"""Seconds between two attempts to open a cluster of the fleet that could not be opened."""

IDENTITY_KEY = "fleet/cluster/{name}"
"""Where the store keeps the identity of each cluster of a fleet, by name: a cluster that cannot be
opened now is still known (a job may wait for it; its records are named)."""

DOWN_KEY = "fleet/down/{name}"
"""Where the store keeps since when, and why, a cluster of a fleet has not answered (``"<epoch seconds>
<reason>"``; absent while it answers)."""


@dataclass(eq=False)
class Member:
    """One cluster of a fleet: its :class:`Seat` (name, checkpoints, identity) and the opened
    :class:`Cluster`, or ``None`` while it cannot be opened (``reopen`` tries again)."""

    seat: Seat
    cluster: Cluster | None = None
    reopen: Callable[[], Awaitable[Cluster]] | None = None
    tried: float | None = None
    """When opening it last failed (it is tried again :data:`REOPEN` s later)."""

    @property
    def name(self) -> str:
        return self.seat.name


class FleetBase:
    """The clusters of a :class:`~dispatch.fleet.Fleet` by name over one ``store`` (see the module
    docstring); ``weights`` and ``patience`` are its placer's."""

    def __init__(
        self,
        members: Sequence[Member],
        store: Store,
        *,
        policy: Policy = DEFAULT_POLICY,
        clock: Clock | None = None,
        weights: Mapping[str, float] | None = None,
        patience: float = PATIENCE,
        rng: random.Random | None = None,
    ) -> None:
        self.members = list(members)
        self.store = store
        self.policy = policy
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.rng = rng
        for m in self.members:
            if m.cluster is not None:
                self._seated(m, m.cluster)
        self.placer = Placer(
            [m.seat for m in self.members], store, self.clock, weights=weights, patience=patience
        )
        self._closed = False

    # ------------------------------------------------------------------ the clusters

    def _seated(self, member: Member, cluster: Cluster) -> None:
        member.cluster = cluster
        member.seat.opened(cluster.backend)
        member.seat.unreachable = lambda: cluster.unreachable

    async def open_members(self) -> None:
        """Open each cluster that is not open yet and was not tried within :data:`REOPEN` seconds (not at
        every submit; a failure leaves it closed, ``seat.down`` saying why, ``seat.down_since`` since
        when), and learn, from the store, the identities of those that cannot be opened now."""
        now = self.clock.now()
        for m in self.members:
            opened = False
            # Half a second early counts: the fleet supervisor's wait of REOPEN s, on the event loop's
            # clock, may end a moment before this clock says so (and the attempt would wait another REOPEN).
            due = m.tried is None or now - m.tried >= REOPEN - 0.5
            if m.cluster is None and m.reopen is not None and due:
                try:
                    self._seated(m, await m.reopen())
                    opened = True
                except Exception as exc:  # any adapter's failure to open: that cluster is down, not us
                    m.tried = now
                    m.seat.down = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            key = IDENTITY_KEY.format(name=m.name)
            if m.cluster is not None:
                if await self._note(key) != m.seat.identity:
                    await self._set_note(key, m.seat.identity)
                if opened:  # it answered its opening
                    await self._answers(m)
            else:
                if not m.seat.identity:
                    m.seat.identity = await self._note(key) or ""
                await self._down(m, m.seat.down or "not opened")

    def member(self, name: str) -> Member:
        """The cluster of that name; ``InvalidError`` naming the fleet's clusters when there is none."""
        for m in self.members:
            if m.name == name:
                return m
        names = ", ".join(m.name for m in self.members)
        raise InvalidError(f"no cluster {name!r} in this fleet; it has: {names}", path="cluster")

    def name_of(self, identity: str) -> str:
        """The fleet's name for a cluster identity (the identity itself when it is none of the fleet's)."""
        for m in self.members:
            if identity and m.seat.identity == identity:
                return m.name
        return identity

    def member_of(self, record: JobRecord) -> Member | None:
        """The cluster of the fleet the record's current incarnation belongs to (``None``: none of the
        fleet's, or the record has no cluster yet)."""
        for m in self.members:
            if record.cluster and m.seat.identity == record.cluster:
                return m
        return None

    def owner(self, record: JobRecord) -> Cluster:
        """The opened cluster the record belongs to; ``UnavailableError`` when its cluster is one of the
        fleet that cannot be reached, :class:`~dispatch.errors.OtherClusterError` when it is none of the
        fleet's."""
        m = self.member_of(record)
        if m is not None:
            if m.cluster is None:
                raise UnavailableError(
                    f"job {record.job_id!r} is on cluster {m.name}, which cannot be reached now "
                    f"({m.seat.down or 'not opened'}); its record is as last known"
                )
            return m.cluster
        opened = [m.cluster for m in self.members if m.cluster is not None]
        for cluster in opened:
            if cluster.owns(record):  # a record without a cluster yet: its adapter's
                return cluster
        if not opened:
            raise UnavailableError("no cluster of this fleet can be reached now")
        raise OtherClusterError(record.job_id, record.cluster)

    def _any(self) -> Cluster:
        for m in self.members:
            if m.cluster is not None:
                return m.cluster
        raise UnavailableError("no cluster of this fleet can be reached now")

    async def belongs(self, record: JobRecord) -> bool:
        """Whether this process may change ``record``: its cluster is one of the fleet, and opened (SPEC
        §6.1; as :meth:`Cluster.belongs <dispatch.Cluster.belongs>`). ``False`` for another cluster's
        record, and for one of a cluster of the fleet that cannot be opened now: it is shown as last
        known. Whether its cluster answers is :meth:`unreachable_of`."""
        try:
            cluster = self.owner(record)
        except (UnavailableError, OtherClusterError):
            return False
        return await cluster.belongs(record)

    def unreachable_of(self, record: JobRecord) -> Unreachable | None:
        """Since when, and why, the record's own cluster (one of the fleet) has not been read; ``None``
        while it answers, or when the record is none of the fleet's clusters'."""
        m = self.member_of(record)
        if m is None:
            return None
        if m.cluster is None:
            return Unreachable(at=m.seat.down_since or self.clock.now(), reason=m.seat.down or "not opened")
        return m.cluster.unreachable

    # ------------------------------------------------------------------ whether each answers

    async def _down(self, member: Member, reason: str) -> Unreachable:
        """The cluster does not answer: since when (kept in the store from the first process that saw
        it), and why (now)."""
        seat = member.seat
        if seat.down_since is None:
            kept = await self._note(DOWN_KEY.format(name=member.name))
            since = _since(kept)
            if since is None:
                since = self.clock.now()
                await self._set_note(DOWN_KEY.format(name=member.name), f"{since!r} {reason}")
            seat.down_since = since
        return Unreachable(at=seat.down_since, reason=reason)

    async def _answers(self, member: Member) -> None:
        """The cluster answers (again): its note of since when it did not is dropped."""
        member.seat.down_since = None
        key = DOWN_KEY.format(name=member.name)
        if await self._note(key) is not None:
            await self._set_note(key, None)

    # ------------------------------------------------------------------ notes beside the records

    async def note(self, key: str) -> str | None:
        """A value kept beside the records (see :meth:`Cluster.note <dispatch.Cluster.note>`)."""
        return await self._note(key)

    async def set_note(self, key: str, value: str | None) -> None:
        await self._set_note(key, value)

    async def _note(self, key: str) -> str | None:
        return await self.store.get_value(key) if isinstance(self.store, KeyValues) else None

    async def _set_note(self, key: str, value: str | None) -> None:
        """Keep a note; one the store refuses (a role that may only read it) is left unwritten: notes
        are what a process learned, which the next one learns again."""
        if isinstance(self.store, KeyValues):
            try:
                await self.store.put_value(key, value)
            except DispatchError:
                pass


def _since(note: str | None) -> float | None:
    """The time at the head of a :data:`DOWN_KEY` note (``None``: no note, or not one of ours)."""
    if not note:
        return None
    head = note.split(" ", 1)[0]
    try:
        return float(head)
    except ValueError:
        return None
