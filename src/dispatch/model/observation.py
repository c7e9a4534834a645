"""What a backend reports: :class:`Observation` (an outcome as of a time) and watch :class:`Change`."""

from __future__ import annotations

from msgspec import Struct

from dispatch.model._base import Model
from dispatch.model.identity import Handle
from dispatch.model.outcome import Cause, Outcome, State

__all__ = ["Change", "Observation"]


class Observation(Model, frozen=True):
    """The folded state of one incarnation as of ``at`` (epoch seconds)."""

    handle: Handle
    outcome: Outcome
    at: float

    @property
    def state(self) -> State:
        return self.outcome.state

    @property
    def cause(self) -> Cause:
        return self.outcome.cause


class Change(Struct, frozen=True):
    """One watch event: the new observation of an incarnation and the cursor to resume after it."""

    observation: Observation
    cursor: str

    @property
    def handle(self) -> Handle:
        return self.observation.handle
