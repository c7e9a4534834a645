"""A fleet of clusters over one store (SPEC §15): :func:`open_fleet` (each cluster a :class:`Berth`: its
adapter and config), :class:`Fleet`, :class:`FleetSupervisor`, and the placement reading
(:class:`Placer`, :class:`Seat`)."""

from typing import TYPE_CHECKING, Any

from .base import Member
from .fleet import Fleet
from .opening import Berth, open_fleet
from .placer import PATIENCE, Placer, Seat

if TYPE_CHECKING:
    from .supervisor import FleetSupervisor

__all__ = ["PATIENCE", "Berth", "Fleet", "FleetSupervisor", "Member", "Placer", "Seat", "open_fleet"]


def __getattr__(name: str) -> Any:
    # The supervisor loads only where one runs: a command that reads a fleet's records does not need it.
    if name == "FleetSupervisor":
        from .supervisor import FleetSupervisor

        return FleetSupervisor
    raise AttributeError(f"module 'dispatch.fleet' has no attribute {name!r}")
