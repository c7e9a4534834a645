"""What a backend reports: :class:`Observation` (an outcome as of a time) and watch :class:`Change`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dispatch.model._decode import Fields, as_number
from dispatch.model.identity import Handle
from dispatch.model.outcome import Cause, Outcome, State

__all__ = ["Change", "Observation"]


@dataclass(frozen=True, slots=True)
class Observation:
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

    def to_json(self) -> dict[str, Any]:
        return {"handle": self.handle.to_json(), "outcome": self.outcome.to_json(), "at": self.at}

    @classmethod
    def from_json(cls, value: Any, path: str = "") -> Observation:
        f = Fields(value, path)
        obs = cls(
            handle=f.required("handle", Handle.from_json),
            outcome=f.required("outcome", Outcome.from_json),
            at=f.required("at", as_number),
        )
        f.done()
        return obs


@dataclass(frozen=True, slots=True)
class Change:
    """One watch event: the new observation of an incarnation and the cursor to resume after it."""

    observation: Observation
    cursor: str

    @property
    def handle(self) -> Handle:
        return self.observation.handle
