"""A fleet of clusters over one store (SPEC §15): :func:`open_fleet` (each cluster a :class:`Berth`: its
adapter and config), :class:`Fleet`, :class:`FleetSupervisor`, and the placement reading
(:class:`Placer`, :class:`Seat`)."""

from .base import Member
from .fleet import Fleet
from .opening import Berth, open_fleet
from .placer import PATIENCE, Placer, Seat
from .supervisor import FleetSupervisor

__all__ = ["PATIENCE", "Berth", "Fleet", "FleetSupervisor", "Member", "Placer", "Seat", "open_fleet"]
