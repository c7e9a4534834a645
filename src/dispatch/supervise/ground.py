"""What every part of one supervisor works over: :class:`Ground`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from dispatch.backend import Backend
from dispatch.clock import Clock
from dispatch.model import JobRecord, Policy
from dispatch.placement import Placement
from dispatch.records import Store

__all__ = ["Ground", "Placing"]


class Placing(Protocol):
    """Where a fleet of clusters places a record's next incarnation (:class:`dispatch.fleet.Placer`)."""

    async def place(self, record: JobRecord) -> Placement: ...


@dataclass(frozen=True, slots=True)
class Ground:
    """The cluster a supervisor works on (``backend``), its records (``store``), its ``clock``, the
    ``policy`` of records without their own, and the ``holder`` its leases are taken as: given once, to
    each part of the supervisor (:mod:`dispatch.supervise`). ``placer``: in a fleet of clusters, where
    each next incarnation goes (``None``: this cluster, the only one)."""

    backend: Backend
    store: Store
    clock: Clock
    policy: Policy
    holder: str
    placer: Placing | None = None
