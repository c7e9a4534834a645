"""A fleet of clusters over one store (SPEC §15): :class:`Fleet`, :class:`FleetSupervisor`, and the
placement reading (:class:`Placer`, :class:`Seat`)."""

from .fleet import Fleet, Member
from .placer import PATIENCE, Placer, Seat
from .supervisor import FleetSupervisor

__all__ = ["PATIENCE", "Fleet", "FleetSupervisor", "Member", "Placer", "Seat"]
