"""Several clusters over one store, used as one: :class:`Fleet` (SPEC §15).

A fleet places each new job on the first of its clusters that takes it (:mod:`dispatch.placement`) and
sends every other operation to the cluster of the record's current incarnation — the only one that may
change it (SPEC §6.1). A cluster that cannot be opened or does not answer holds its own records as last
known; the others go on. :meth:`Fleet.supervisor` supervises every cluster at once, each next incarnation
placed anew (a requeue under a rule with ``elsewhere`` leaves its cluster).
"""

from __future__ import annotations

import builtins
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from dispatch import chance, decide
from dispatch.clock import Clock, SystemClock
from dispatch.cluster import Cluster
from dispatch.errors import (
    ConflictError,
    InvalidError,
    OtherClusterError,
    UnavailableError,
    UnsupportedError,
)
from dispatch.model import (
    DEFAULT_POLICY,
    Capabilities,
    JobRecord,
    JobSpec,
    Policy,
    State,
    Transition,
    Unreachable,
    check_job_id,
    new_job_id,
)
from dispatch.placement import Candidate, place
from dispatch.records import Changes, KeyValues, Listing, Store

from .placer import PATIENCE, Placer, Seat
from .supervisor import REOPEN, FleetSupervisor

__all__ = ["Fleet", "Member"]

IDENTITY_KEY = "fleet/cluster/{name}"
"""Where the store keeps the identity of each cluster of a fleet, by name: a cluster that cannot be
opened now is still known (a job may wait for it; its records are named)."""


@dataclass(eq=False)
class Member:
    """One cluster of a fleet: its :class:`Seat` (name, checkpoints, identity) and the opened
    :class:`Cluster`, or ``None`` while it cannot be opened (``reopen`` tries again)."""

    seat: Seat
    cluster: Cluster | None = None
    reopen: Callable[[], Awaitable[Cluster]] | None = None
    tried: float | None = None
    """When opening it last failed (it is tried again :data:`~dispatch.fleet.supervisor.REOPEN` s later)."""

    @property
    def name(self) -> str:
        return self.seat.name


class Fleet:
    """Clusters by name over one ``store`` (see the module docstring). ``weights`` (name -> weight > 0)
    replaces the configured order by a weighted spread; ``patience``: see :data:`PATIENCE`.

    An async context manager; :meth:`close` closes every cluster's backend, then the store."""

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
        """Open each cluster that is not open yet and was not tried within :data:`REOPEN` seconds (a
        failure leaves it closed, ``seat.down`` saying why), and learn, from the store, the identities of
        those that cannot be opened now."""
        now = self.clock.now()
        for m in self.members:
            due = m.tried is None or now - m.tried >= REOPEN
            if m.cluster is None and m.reopen is not None and due:
                try:
                    self._seated(m, await m.reopen())
                except Exception as exc:  # any adapter's failure to open: that cluster is down, not us
                    m.tried = now
                    m.seat.down = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            key = IDENTITY_KEY.format(name=m.name)
            if m.cluster is not None:
                if await self._note(key) != m.seat.identity:
                    await self._set_note(key, m.seat.identity)
            elif not m.seat.identity:
                m.seat.identity = await self._note(key) or ""

    def member(self, name: str) -> Member:
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

    def owner(self, record: JobRecord) -> Cluster:
        """The opened cluster the record belongs to; ``UnavailableError`` when its cluster is one of the
        fleet that cannot be reached, :class:`~dispatch.errors.OtherClusterError` when it is none of the
        fleet's."""
        for m in self.members:
            if record.cluster and m.seat.identity == record.cluster:
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

    # ------------------------------------------------------------------ the operator

    async def submit(
        self,
        spec: JobSpec,
        *,
        job_id: str | None = None,
        held: bool = False,
        policy: Policy | None = None,
        clusters: Sequence[str] = (),
    ) -> JobRecord:
        """Record a new job and start it on the first cluster that takes it (``clusters``: only among
        these names). When none of the allowed ones can take it now but one of them is known, the job
        waits for it (recorded there, started by its supervisor once it answers); ``UnsupportedError``
        when every allowed cluster refuses the spec, with each one's reasons."""
        if not isinstance(spec, JobSpec):
            raise InvalidError(f"expected a JobSpec, got {type(spec).__name__}", path="spec")
        allowed = self._allowed(clusters)
        job_id = check_job_id(job_id) if job_id is not None else new_job_id()
        await self.open_members()
        candidates = await self.placer.candidates(spec, job_id, 1, allowed)
        placement = self._place(candidates)
        chosen = placement[0]
        if chosen is None:
            return await self._wait_for(spec, job_id, held, policy, allowed, candidates, placement[1])
        cluster = self.member(chosen.name).cluster
        assert cluster is not None  # only an opened cluster takes a job
        return await cluster.submit(
            spec, job_id=job_id, held=held, policy=policy, clusters=allowed, placed=placement[1]
        )

    def _allowed(self, clusters: Sequence[str]) -> tuple[str, ...]:
        if isinstance(clusters, str):
            clusters = [clusters]
        for name in clusters:
            self.member(name)  # an unknown name is refused, naming the fleet's
        return tuple(dict.fromkeys(clusters))

    @staticmethod
    def _place(candidates: Sequence[Candidate]) -> tuple[Candidate | None, str]:
        got = place(candidates)
        return got.chosen, got.why

    async def _wait_for(
        self,
        spec: JobSpec,
        job_id: str,
        held: bool,
        policy: Policy | None,
        allowed: tuple[str, ...],
        candidates: Sequence[Candidate],
        why: str,
    ) -> JobRecord:
        """No cluster takes the job now: it waits for the first allowed one that is known and only down
        or busy; refused when every allowed cluster refuses the spec itself."""
        if candidates and all(c.refusing.startswith("does not take this job") for c in candidates):
            raise UnsupportedError([f"no cluster of the fleet takes this job: {why}"])
        known = [c for c in candidates if c.identity and not c.refusing.startswith("does not take")]
        if not known:
            raise UnavailableError(f"{why}; no record was written")
        wait = known[0]
        note = f"waits for {wait.name}: {why}"
        record, first = decide.submitted(
            job_id,
            spec,
            policy=policy,
            held=held,
            now=self.clock.now(),
            cluster=wait.identity,
            nonce=chance.token(chance.source(self.rng), 8),
            clusters=allowed,
            placed=note,
        )
        await self.store.create(record, first)
        return record

    async def cancel(self, job_id: str) -> JobRecord:
        return await self.owner(await self.store.get(job_id)).cancel(job_id)

    async def hold(self, job_id: str) -> JobRecord:
        return await self.owner(await self.store.get(job_id)).hold(job_id)

    async def release(self, job_id: str) -> JobRecord:
        return await self.owner(await self.store.get(job_id)).release(job_id)

    async def resubmit(self, job_id: str, spec: JobSpec | None = None, **options: Any) -> JobRecord:
        """A finished job's next incarnation, on the cluster of its last one (which must see it gone)."""
        return await self.owner(await self.store.get(job_id)).resubmit(job_id, spec, **options)

    async def dry_run(self, spec: JobSpec, **options: Any) -> Mapping[str, Any]:
        """What the first cluster that takes the job would create (creating nothing)."""
        await self.open_members()
        candidates = await self.placer.candidates(spec, options.get("job_id") or "dry-run", 1)
        chosen, why = self._place(candidates)
        if chosen is None:
            raise UnavailableError(why)
        cluster = self.member(chosen.name).cluster
        assert cluster is not None
        return await cluster.dry_run(spec, **options)

    async def forget(self, job_id: str, reason: str) -> JobRecord:
        """End a record whose cluster is gone: refused (``ConflictError``) for a cluster of the fleet."""
        rec = await self.store.get(job_id)
        for m in self.members:
            if rec.cluster and rec.cluster == m.seat.identity and not rec.outcome.terminal:
                raise ConflictError(
                    f"job {job_id!r} is on cluster {m.name} of this fleet: cancel it instead (dispatch "
                    "cancel), or take that cluster out of the config if it is gone"
                )
        return await self._any().forget(job_id, reason)

    async def purge(self, older_than: float) -> int:
        return await self._any().purge(older_than)

    # ------------------------------------------------------------------ the observer

    async def get(self, job_id: str) -> JobRecord:
        """The job's record, refreshed from its cluster when that cluster answers (else as last known)."""
        rec = await self.store.get(job_id)
        try:
            cluster = self.owner(rec)
        except (UnavailableError, ConflictError):
            return rec
        return await cluster.get(job_id)

    async def list(self, states: Iterable[State] | None = None) -> Listing:
        """Every record, each refreshed by its own cluster (one listing of each cluster that answers)."""
        wanted = None if states is None else frozenset(states)
        stored = await self.store.list()
        best: dict[str, JobRecord] = {r.job_id: r for r in stored}
        for m in self.members:
            if m.cluster is None:
                continue
            for rec in await m.cluster.list():
                if m.cluster.owns(rec):
                    best[rec.job_id] = rec
        records = [best[r.job_id] for r in stored]
        return Listing((r for r in records if wanted is None or r.state in wanted), stored.unreadable)

    async def watch(self, job_id: str | None = None) -> AsyncIterator[JobRecord]:
        """One job's records as they change, from its cluster (the fleet follows one job at a time)."""
        if job_id is None:
            raise UnsupportedError(["a fleet follows one job at a time: name it"])
        rec = await self.store.get(job_id)
        try:
            cluster = self.owner(rec)
        except (UnavailableError, ConflictError):
            yield rec
            return
        async for got in cluster.watch(job_id):
            yield got

    async def output(self, job_id: str, **options: Any) -> AsyncIterator[str]:
        rec = await self.store.get(job_id)
        async for line in self.owner(rec).output(job_id, **options):
            yield line

    async def history(self, job_id: str) -> builtins.list[Transition]:
        return await self.store.history(job_id)

    async def record(self, job_id: str) -> JobRecord:
        return await self.store.get(job_id)

    async def records(self) -> Listing:
        return await self.store.list()

    def changes(self) -> Changes | None:
        return self._any().changes()

    async def note(self, key: str) -> str | None:
        return await self._note(key)

    async def set_note(self, key: str, value: str | None) -> None:
        await self._set_note(key, value)

    async def _note(self, key: str) -> str | None:
        return await self.store.get_value(key) if isinstance(self.store, KeyValues) else None

    async def _set_note(self, key: str, value: str | None) -> None:
        if isinstance(self.store, KeyValues):
            await self.store.put_value(key, value)

    async def capabilities(self) -> dict[str, Capabilities | Unreachable]:
        """Each cluster's capabilities by name, or since when and why it cannot be reached."""
        out: dict[str, Capabilities | Unreachable] = {}
        for m in self.members:
            if m.cluster is None:
                out[m.name] = Unreachable(at=self.clock.now(), reason=m.seat.down or "not opened")
                continue
            try:
                out[m.name] = await m.cluster.capabilities()
            except UnavailableError as exc:
                out[m.name] = m.cluster.unreachable or Unreachable(at=self.clock.now(), reason=str(exc))
        return out

    # ------------------------------------------------------------------ supervising, closing

    def supervisor(self, policy: Policy | None = None, **options: Any) -> FleetSupervisor:
        """One supervisor per cluster of the fleet, each placing next incarnations with the fleet's
        placer (``options``: the :class:`~dispatch.supervise.Supervisor` options; ``holder`` gets each
        cluster's name appended)."""
        return FleetSupervisor(self, policy=policy if policy is not None else self.policy, **options)

    async def __aenter__(self) -> Fleet:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close every cluster's backend, then the store. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            for m in self.members:
                if m.cluster is not None:
                    await m.cluster.backend.close()
        finally:
            await self.store.close()

    def __repr__(self) -> str:
        return f"Fleet({', '.join(m.name for m in self.members)})"
