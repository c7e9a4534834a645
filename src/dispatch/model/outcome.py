"""What happened to a job, and why: :class:`State`, :class:`Cause`, :class:`Evidence`, :class:`Outcome`."""

from __future__ import annotations

from enum import StrEnum

from msgspec.structs import force_setattr

from dispatch.errors import InvalidError
from dispatch.model._base import Int64, Model

__all__ = ["TERMINAL_STATES", "Cause", "Evidence", "Outcome", "State"]


class State(StrEnum):
    """The coarse state of a job."""

    PENDING = "pending"  # recorded, not yet on the cluster
    QUEUED = "queued"  # on the cluster, waiting for capacity or admission
    HELD = "held"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"  # asked to end (by dispatch, a person or the cluster); some compute remains
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"  # the evidence vanished; the outcome cannot be known

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    @property
    def rank(self) -> int:
        """How far along its incarnation a state is: within one incarnation the state never goes back
        to a lower rank (SPEC §2.3). ``held`` is a person's pause, not progress: it ranks with
        ``queued``."""
        return _RANK[self]


TERMINAL_STATES = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED, State.LOST})


_RANK = {
    State.PENDING: 0,
    State.QUEUED: 1,
    State.HELD: 1,
    State.STARTING: 2,
    State.RUNNING: 3,
    State.STOPPING: 4,
    State.SUCCEEDED: 5,
    State.FAILED: 5,
    State.CANCELLED: 5,
    State.LOST: 5,
}


class Cause(StrEnum):
    """The typed *why* of a state. New causes may be added; one is never folded into another."""

    NONE = "none"
    EXIT_CODE = "exit_code"
    OUT_OF_MEMORY = "out_of_memory"
    PREEMPTED = "preempted"
    EVICTED = "evicted"
    NODE_LOST = "node_lost"
    TIMEOUT = "timeout"
    NO_CAPACITY = "no_capacity"
    IMAGE_PULL = "image_pull"
    INVALID_SPEC = "invalid_spec"
    CONFIG_ERROR = "config_error"  # the cluster cannot create the job's containers as configured (a missing Secret, claim, ...)
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


class Evidence(Model, frozen=True):
    """Where a cause was read from: which object, its reason and message, exit code, node, time, and
    for failures the last lines of the failing node's output when they could be read. ``rank``: which
    of the job's nodes (0 for the first) it is about, when it is about one (``node`` is the machine)."""

    kind: str
    name: str
    reason: str = ""
    message: str = ""
    exit_code: Int64 | None = None
    node: str | None = None
    at: float | None = None
    output: tuple[str, ...] = ()
    rank: Int64 | None = None

    def __post_init__(self) -> None:
        # A lone string would silently become a tuple of its characters.
        if not isinstance(self.output, list | tuple) or not all(isinstance(x, str) for x in self.output):
            raise InvalidError(f"expected a sequence of lines, got {self.output!r}", path="output")
        force_setattr(self, "output", tuple(self.output))

    def __str__(self) -> str:
        parts = [f"{self.kind}/{self.name}"]
        if self.reason:
            parts.append(self.reason)
        if self.exit_code is not None:
            parts.append(f"exit code {self.exit_code}")
        if self.node:
            parts.append(f"on node {self.node}")
        text = " ".join(parts)
        return f"{text}: {self.message}" if self.message else text


class Outcome(Model, omit_defaults=False, frozen=True):
    """A coarse state plus a typed cause, with the evidence it was derived from.

    Its JSON form always has every field, ``"cause": "none"`` included: that is what readers look for."""

    state: State
    cause: Cause = Cause.NONE
    evidence: tuple[Evidence, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.state, State):
            raise InvalidError(f"expected a State, got {self.state!r}", path="state")
        if not isinstance(self.cause, Cause):
            raise InvalidError(f"expected a Cause, got {self.cause!r}", path="cause")
        if not isinstance(self.evidence, list | tuple) or not all(
            isinstance(e, Evidence) for e in self.evidence
        ):
            raise InvalidError(f"expected a sequence of Evidence, got {self.evidence!r}", path="evidence")
        force_setattr(self, "evidence", tuple(self.evidence))

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    @property
    def failed_rank(self) -> int | None:
        """The node (index) that did not succeed, when the evidence names one (``Evidence.rank``)."""
        if self.state is State.SUCCEEDED:
            return None
        return next((ev.rank for ev in self.evidence if ev.rank is not None), None)

    def __str__(self) -> str:
        if self.cause is Cause.NONE:
            return self.state.value
        return f"{self.state.value} ({self.cause.value})"
