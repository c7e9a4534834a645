"""What happened to a job, and why: :class:`State`, :class:`Cause`, :class:`Evidence`, :class:`Outcome`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dispatch.errors import InvalidError
from dispatch.model._decode import Fields, as_enum, as_int, as_list, as_number, as_str

__all__ = ["TERMINAL_STATES", "Cause", "Evidence", "Outcome", "State"]


class State(StrEnum):
    """The coarse state of a job."""

    PENDING = "pending"  # recorded, not yet on the cluster
    QUEUED = "queued"  # on the cluster, waiting for capacity or admission
    HELD = "held"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    LOST = "lost"  # the evidence vanished; the outcome cannot be known

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES


TERMINAL_STATES = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED, State.LOST})


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
    CANCELLED = "cancelled"
    UNKNOWN = "unknown"


@dataclass(frozen=True, slots=True)
class Evidence:
    """Where a cause was read from: which object, its reason and message, exit code, node, time, and
    for failures the last lines of the failing node's output when they could be read."""

    kind: str
    name: str
    reason: str = ""
    message: str = ""
    exit_code: int | None = None
    node: str | None = None
    at: float | None = None
    output: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # A lone string would silently become a tuple of its characters.
        if not isinstance(self.output, list | tuple) or not all(isinstance(x, str) for x in self.output):
            raise InvalidError(f"expected a sequence of lines, got {self.output!r}", path="output")
        object.__setattr__(self, "output", tuple(self.output))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "name": self.name}
        if self.reason:
            out["reason"] = self.reason
        if self.message:
            out["message"] = self.message
        if self.exit_code is not None:
            out["exitCode"] = self.exit_code
        if self.node is not None:
            out["node"] = self.node
        if self.at is not None:
            out["at"] = self.at
        if self.output:
            out["output"] = list(self.output)
        return out

    @classmethod
    def from_json(cls, value: Any, path: str = "") -> Evidence:
        f = Fields(value, path)
        ev = cls(
            kind=f.required("kind", as_str),
            name=f.required("name", as_str),
            reason=f.optional("reason", as_str, ""),
            message=f.optional("message", as_str, ""),
            exit_code=f.optional("exitCode", as_int, None),
            node=f.optional("node", as_str, None),
            at=f.optional("at", as_number, None),
            output=tuple(f.optional("output", lambda v, p: as_list(v, p, as_str), [])),
        )
        f.done()
        return ev

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


@dataclass(frozen=True, slots=True)
class Outcome:
    """A coarse state plus a typed cause, with the evidence it was derived from."""

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
        object.__setattr__(self, "evidence", tuple(self.evidence))

    @property
    def terminal(self) -> bool:
        return self.state.terminal

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state.value, "cause": self.cause.value}
        if self.evidence:
            out["evidence"] = [e.to_json() for e in self.evidence]
        return out

    @classmethod
    def from_json(cls, value: Any, path: str = "") -> Outcome:
        f = Fields(value, path)
        out = cls(
            state=f.required("state", lambda v, p: as_enum(State, v, p)),
            cause=f.optional("cause", lambda v, p: as_enum(Cause, v, p), Cause.NONE),
            evidence=tuple(f.optional("evidence", lambda v, p: as_list(v, p, Evidence.from_json), [])),
        )
        f.done()
        return out

    def __str__(self) -> str:
        if self.cause is Cause.NONE:
            return self.state.value
        return f"{self.state.value} ({self.cause.value})"
