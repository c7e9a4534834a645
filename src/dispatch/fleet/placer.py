"""Reading a fleet's clusters for placement: :class:`Seat` (one cluster) and :class:`Placer`.

The placer turns each seat into a :class:`~dispatch.placement.Candidate` — is it open and answering, does
its adapter accept the job's spec (``capabilities(spec)``), do jobs wait there for capacity longer than
the fleet's patience — and lets :func:`dispatch.placement.place` choose. The only I/O of a placement is
here: one ``capabilities(spec)`` per open cluster, one listing of the queued records.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from dispatch.backend import Backend
from dispatch.clock import Clock
from dispatch.errors import DispatchError, InvalidError, UnsupportedError
from dispatch.model import Cause, JobRecord, JobSpec, State, Unreachable
from dispatch.placement import Candidate, Placement, order, place
from dispatch.reader import UNREACHABLE_ERRORS
from dispatch.records import Store

__all__ = ["PATIENCE", "Placer", "Seat"]

PATIENCE = 300.0
"""Seconds a job may wait on a cluster for capacity before that cluster counts as refusing new work."""

PLACE_TIMEOUT = 10.0
"""Seconds a cluster is given to say whether it accepts a spec before it counts as unreachable."""


def _answering() -> Unreachable | None:
    return None


@dataclass(eq=False)
class Seat:
    """One cluster of a fleet: its configured ``name``, the ``checkpoints`` directory its jobs see (a name
    shared by the clusters that see the same one), its ``backend`` once opened (``None`` while it cannot
    be: ``down`` says why), its ``identity`` (known from its last open, even while it is down) and
    ``unreachable``, how its readers last found it (``None``: answering)."""

    name: str
    checkpoints: str = ""
    backend: Backend | None = None
    identity: str = ""
    down: str = ""
    unreachable: Callable[[], Unreachable | None] = field(default=_answering)

    def opened(self, backend: Backend) -> None:
        self.backend, self.identity, self.down = backend, backend.cluster_id, ""


class Placer:
    """Places incarnations over ``seats`` (in the configured order, or by ``weights``), the fleet's records
    in ``store``. ``patience``: see :data:`PATIENCE`."""

    def __init__(
        self,
        seats: Sequence[Seat],
        store: Store,
        clock: Clock,
        *,
        weights: Mapping[str, float] | None = None,
        patience: float = PATIENCE,
    ) -> None:
        names = [s.name for s in seats]
        if len(set(names)) != len(names) or not names:
            raise InvalidError(f"expected distinct cluster names, got {names}", path="clusters")
        self.seats = list(seats)
        self.store = store
        self.clock = clock
        self.weights = dict(weights) if weights else None
        self.patience = patience

    def seat(self, *, name: str = "", identity: str = "") -> Seat | None:
        """The seat of that name, or of that cluster identity."""
        for s in self.seats:
            if (name and s.name == name) or (identity and s.identity == identity):
                return s
        return None

    async def place(self, record: JobRecord) -> Placement:
        """Where the record's next incarnation goes: among the clusters it allows (``record.clusters``),
        away from the one a requeue ``elsewhere`` leaves (``record.plan.avoid``)."""
        plan = record.plan
        previous = None
        if record.epoch.n > 1 and record.cluster:
            seat = self.seat(identity=record.cluster)
            previous = Candidate(seat.name, seat.identity, checkpoints=seat.checkpoints) if seat else None
        candidates = await self.candidates(record.spec, record.job_id, record.epoch.n, record.clusters)
        return place(
            candidates,
            allowed=record.clusters,
            avoid=plan.avoid if plan is not None else "",
            previous=previous,
        )

    async def candidates(
        self, spec: JobSpec, job_id: str, epoch: int, allowed: Sequence[str] = ()
    ) -> list[Candidate]:
        """Each allowed cluster as placement sees it now, in the order to try them."""
        names = order([s.name for s in self.seats], self.weights, job_id, epoch)
        seats = [s for n in names for s in self.seats if s.name == n and (not allowed or n in allowed)]
        waiting = await self._waiting()
        refusals = await asyncio.gather(*(self._refusal(s, spec, waiting) for s in seats))
        return [
            Candidate(s.name, s.identity, refusing=why, checkpoints=s.checkpoints)
            for s, why in zip(seats, refusals, strict=True)
        ]

    async def _refusal(self, seat: Seat, spec: JobSpec, waiting: Mapping[str, list[float]]) -> str:
        if seat.backend is None:
            return f"unreachable ({seat.down or 'not opened'})"
        gone = seat.unreachable()
        if gone is not None:
            return f"unreachable since {gone.at:.0f} ({gone.reason})"
        try:
            async with asyncio.timeout(PLACE_TIMEOUT):
                caps = await seat.backend.capabilities(spec)
        except (InvalidError, UnsupportedError) as exc:
            return f"does not take this job ({exc})"
        except (*UNREACHABLE_ERRORS, DispatchError) as exc:
            return f"unreachable ({type(exc).__name__}: {exc})"
        if not caps.writable:
            return f"{caps.mode.value}: it accepts no new jobs"
        sinces = waiting.get(seat.identity, [])
        if sinces:
            return f"{len(sinces)} job(s) wait there for capacity, the longest for {self.clock.now() - min(sinces):.0f} s"
        return ""

    async def _waiting(self) -> dict[str, list[float]]:
        """Cluster identity -> since when each job queued there for want of capacity has waited, for those
        waiting longer than the patience (the cluster reports no capacity)."""
        now = self.clock.now()
        out: dict[str, list[float]] = {}
        for rec in await self.store.list(states=[State.QUEUED]):
            since = rec.since if rec.since is not None else rec.updated_at
            if rec.outcome.cause is Cause.NO_CAPACITY and now - since > self.patience and rec.cluster:
                out.setdefault(rec.cluster, []).append(since)
        return out
