"""Job records: what the store keeps for every job, and its history of transitions."""

from __future__ import annotations

from enum import StrEnum
from typing import ClassVar

from dispatch.model._base import Int64, Model
from dispatch.model.identity import Epoch, Handle, check_job_id
from dispatch.model.outcome import Cause, Outcome, State
from dispatch.model.policy import Plan, Policy
from dispatch.model.spec import JobSpec

__all__ = ["Actor", "JobRecord", "Lease", "Transition"]


class Actor(StrEnum):
    """Who caused a transition."""

    USER = "user"
    SUPERVISOR = "supervisor"
    CLUSTER = "cluster"


class Lease(Model, frozen=True):
    """A time-bounded claim on a record by one supervisor; expired leases may be taken over."""

    json_path: ClassVar[str] = "lease"

    holder: str
    expires_at: float

    def live(self, now: float) -> bool:
        return now < self.expires_at


class Transition(Model, frozen=True):
    """One entry of a record's append-only history: what changed, why, and by whom."""

    json_path: ClassVar[str] = "transition"

    at: float
    actor: Actor
    what: str
    why: str = ""
    state: State | None = None
    cause: Cause | None = None
    epoch: Epoch | None = None


class JobRecord(Model, frozen=True):
    """The durable record of one job. Every write to a store is conditional on ``revision``.

    ``cancel_requested`` and ``hold_requested`` are the user's standing intents; ``unknown_write`` names
    a write whose effect could not be known (``OutcomeUnknownError``) until an observation settles it.
    """

    job_id: str
    spec: JobSpec
    created_at: float
    updated_at: float
    policy: Policy | None = None
    epoch: Epoch = Epoch()
    handle: Handle | None = None
    outcome: Outcome = Outcome(State.PENDING)
    hold_token: str | None = None
    plan: Plan | None = None
    cancel_requested: bool = False
    hold_requested: bool = False
    unknown_write: str | None = None
    revision: Int64 = 0
    lease: Lease | None = None

    def __post_init__(self) -> None:
        check_job_id(self.job_id, "jobId")

    @property
    def state(self) -> State:
        return self.outcome.state
