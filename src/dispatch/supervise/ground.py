"""What every part of one supervisor works over: :class:`Ground`."""

from __future__ import annotations

from dataclasses import dataclass

from dispatch.backend import Backend
from dispatch.clock import Clock
from dispatch.model import Policy
from dispatch.records import Store

__all__ = ["Ground"]


@dataclass(frozen=True, slots=True)
class Ground:
    """The cluster a supervisor works on (``backend``), its records (``store``), its ``clock``, the
    ``policy`` of records without their own, and the ``holder`` its leases are taken as: given once, to
    each part of the supervisor (:mod:`dispatch.supervise`)."""

    backend: Backend
    store: Store
    clock: Clock
    policy: Policy
    holder: str
