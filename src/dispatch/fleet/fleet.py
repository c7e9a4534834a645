"""Several clusters over one store, used as one: :class:`Fleet` (SPEC §15).

A fleet places each new job on the first of its clusters that takes it (:mod:`dispatch.placement`) and
sends every other operation to the cluster of the record's current incarnation — the only one that may
change it (SPEC §6.1). A cluster that cannot be opened or does not answer holds its own records as last
known; the others go on. :meth:`Fleet.supervisor` supervises every cluster at once, each next incarnation
placed anew (a requeue under a rule with ``elsewhere`` leaves its cluster).
"""

from __future__ import annotations

import asyncio
import builtins
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any

from dispatch import chance, decide
from dispatch.cluster import POLL_MAX, Cluster
from dispatch.errors import (
    ConflictError,
    DispatchError,
    InvalidError,
    UnavailableError,
    UnsupportedError,
)
from dispatch.model import (
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
from dispatch.records import ChangeNotifier, Changes, Listing

from .base import FleetBase, Member
from .placer import PLACE_TIMEOUT

if TYPE_CHECKING:
    from .supervisor import FleetSupervisor

__all__ = ["Fleet", "Member"]


class Fleet(FleetBase):
    """Clusters by name over one ``store``, used as one (see the module docstring): each cluster a
    :class:`Member`, in the order placement tries them unless ``weights`` (name -> weight > 0) spread
    the jobs; ``patience``: see :data:`~dispatch.fleet.PATIENCE`. :func:`~dispatch.fleet.open_fleet`
    opens one from each cluster's adapter and config.

    An async context manager; :meth:`close` closes every cluster's backend, then the store."""

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
        placement = self._place(candidates, allowed)
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
    def _place(candidates: Sequence[Candidate], allowed: Sequence[str] = ()) -> tuple[Candidate | None, str]:
        got = place(candidates, allowed=allowed)
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
        """One job's records as they change (the fleet follows one job at a time), until it is terminal:
        from its own cluster's watch, and from the next one's once the record moves there (a requeue
        placed elsewhere: the old cluster's watch sees nothing of it, so the record is looked at every
        :data:`~dispatch.cluster.POLL_MAX` seconds meanwhile). A record whose cluster cannot be reached
        is yielded as last known, once."""
        if job_id is None:
            raise UnsupportedError(["a fleet follows one job at a time: name it"])
        last = -1
        while True:
            rec = await self.store.get(job_id)
            try:
                cluster = self.owner(rec)
            except (UnavailableError, ConflictError):
                yield rec
                return
            async for got in self._watch_on(cluster, job_id, rec.cluster):
                if got.revision != last:
                    last = got.revision
                    yield got
                if got.outcome.terminal:
                    return

    async def _watch_on(self, cluster: Cluster, job_id: str, here: str) -> AsyncIterator[JobRecord]:
        """``cluster``'s watch of the job, ending when the record moves to another cluster than ``here``
        (the last record yielded is then the store's, on its new cluster)."""
        queue: asyncio.Queue[JobRecord | None] = asyncio.Queue()

        async def pump() -> None:
            async for got in cluster.watch(job_id):
                await queue.put(got)
            await queue.put(None)

        pumping = asyncio.ensure_future(pump())
        try:
            while True:
                getting = asyncio.ensure_future(queue.get())
                ticking = asyncio.ensure_future(self.clock.sleep(POLL_MAX))
                done, _ = await asyncio.wait({getting, ticking, pumping}, return_when=asyncio.FIRST_COMPLETED)
                ticking.cancel()
                if getting in done:
                    watched = getting.result()
                    if watched is None:  # its cluster's watch ended: the record is terminal there
                        return
                    got = watched
                else:
                    getting.cancel()
                    if pumping in done and pumping.exception() is not None:
                        raise pumping.exception()  # type: ignore[misc]
                    got = await self.store.get(job_id)
                if got.cluster != here or got.outcome.terminal:
                    yield got
                    return
                yield got
        finally:
            pumping.cancel()
            await asyncio.gather(pumping, return_exceptions=True)

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
        """The store's change feed (see :meth:`Cluster.changes <dispatch.Cluster.changes>`): the store's,
        whichever of the clusters answer."""
        return self.store.changes() if isinstance(self.store, ChangeNotifier) else None

    async def capabilities(self) -> dict[str, Capabilities | Unreachable]:
        """Each cluster's capabilities by name, or since when and why it cannot be reached (asked of
        every cluster at once, each given :data:`~dispatch.fleet.placer.PLACE_TIMEOUT` seconds to answer
        a listing of its jobs). The store keeps since when one has not answered (``dispatch clusters``
        in another process says the same)."""
        await self.open_members()
        got = await asyncio.gather(*(self._capabilities(m) for m in self.members))
        return {m.name: caps for m, caps in zip(self.members, got, strict=True)}

    async def _capabilities(self, m: Member) -> Capabilities | Unreachable:
        """Its capabilities, once a listing of its jobs shows it answers (what an adapter knows of its
        cluster it may say without asking it)."""
        if m.cluster is None:
            return await self._down(m, m.seat.down or "not opened")
        try:
            async with asyncio.timeout(PLACE_TIMEOUT):
                caps = await m.cluster.capabilities()
                await m.cluster.backend.list()
        except TimeoutError:
            return await self._down(m, f"it did not answer within {PLACE_TIMEOUT:g} s")
        except DispatchError as exc:
            return await self._down(m, f"{type(exc).__name__}: {exc}")
        await self._answers(m)
        return caps

    # ------------------------------------------------------------------ supervising, closing

    def supervisor(self, policy: Policy | None = None, **options: Any) -> FleetSupervisor:
        """One supervisor per cluster of the fleet, each placing next incarnations with the fleet's
        placer (``options``: the :class:`~dispatch.supervise.Supervisor` options; ``holder`` gets each
        cluster's name appended)."""
        from .supervisor import FleetSupervisor  # the supervisor loads only where one runs

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
