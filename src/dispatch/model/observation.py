"""What a backend reads about an incarnation: a typed reading (SPEC §5), and the watch's :class:`Change`.

A reading is one of three things, which the host treats differently:

- :class:`Observation` — the incarnation was *seen*: its state, cause and evidence, and whether any of
  its :class:`Compute` (a pod, a step, a process) is still there;
- :class:`Absent` — a complete, successful answer of the cluster that does not list the incarnation
  (by the adapter's documented rule for how long an ended job stays visible). Only the host concludes
  ``lost``, and only from two absent readings;
- :class:`Unreachable` — an error, a timeout, a partial answer, an answer that carries errors. It changes
  no record: commands show the last known outcome, and the supervisor waits.
"""

from __future__ import annotations

from enum import StrEnum

from msgspec import Struct

from dispatch.model._base import Model
from dispatch.model.identity import Handle
from dispatch.model.outcome import Cause, Evidence, Outcome, State

__all__ = ["Absent", "Change", "Compute", "Observation", "Reading", "Unreachable"]


class Compute(StrEnum):
    """Whether an incarnation still has compute on the cluster."""

    PRESENT = "present"  # some pod, step or process of it exists (running or terminating)
    GONE = "gone"  # none is left
    UNKNOWN = "unknown"  # the adapter cannot tell (e.g. pods are not visible with its credentials)


class Observation(Model, frozen=True):
    """The incarnation as *seen* at ``at`` (epoch seconds): its folded outcome and whether its compute
    remains. A terminal outcome with ``compute`` present is not yet terminal for the host: the record
    says ``stopping`` until a reading finds the compute gone."""

    handle: Handle
    outcome: Outcome
    at: float
    compute: Compute = Compute.UNKNOWN

    @property
    def state(self) -> State:
        return self.outcome.state

    @property
    def cause(self) -> Cause:
        return self.outcome.cause


class Absent(Model, frozen=True):
    """A complete answer of the cluster, read at ``at``, that does not list incarnation ``handle``:
    neither its object nor any compute of it is there. ``evidence`` says what was asked (which objects
    were looked for, and how long the cluster keeps an ended one visible)."""

    handle: Handle
    at: float
    evidence: tuple[Evidence, ...] = ()


class Unreachable(Model, frozen=True):
    """No trustworthy answer at ``at``: ``reason`` says why (an error, a timeout, a partial answer, an
    answer that carries errors). ``handle``: the incarnation asked about, if one was."""

    at: float
    reason: str
    handle: Handle | None = None

    def __str__(self) -> str:
        return self.reason


Reading = Observation | Absent | Unreachable
"""What one read of an incarnation gives (see the module docstring)."""


class Change(Struct, frozen=True):
    """One watch event: the new reading of an incarnation (seen or absent) and the cursor to resume
    after it."""

    reading: Observation | Absent
    cursor: str

    @property
    def handle(self) -> Handle:
        return self.reading.handle

    @property
    def observation(self) -> Observation | None:
        """The reading when the incarnation was seen (``None`` for an absent one)."""
        return self.reading if isinstance(self.reading, Observation) else None
