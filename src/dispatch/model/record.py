"""Job records: what the store keeps for every job, and its history of transitions."""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import ClassVar

from msgspec.structs import force_setattr

from dispatch.errors import InvalidError
from dispatch.model._base import EMPTY_MAP, Int64, Model, frozen_map
from dispatch.model.identity import Epoch, Handle, Identity, check_job_id, check_nonce
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
    ``cluster`` is the identity of the cluster the job's current incarnation belongs to: only a process
    opened on that cluster changes the record (empty in records written before dispatch recorded it).
    ``requeues`` counts the automatic requeues made under each policy rule since the user last submitted
    or resubmitted the job (each rule's budget). ``nonce`` is drawn when the record is created and takes
    part in every incarnation's :class:`Identity`, so objects a purged record (or another store's record
    of the same job id) left on a cluster are never taken for this record's. ``since`` is when the
    record entered its current state. ``stop_asked`` is when the supervisor last asked the cluster to
    end what remains of the current incarnation's compute after it ended (not a cancel: the outcome stays
    the cluster's). ``clusters`` names the clusters of a fleet the job may be placed on (SPEC §15; empty:
    any of them).
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
    cluster: str = ""
    requeues: Mapping[str, Int64] = EMPTY_MAP
    nonce: str = ""
    since: float | None = None
    stop_asked: float | None = None
    clusters: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check_job_id(self.job_id, "jobId")
        check_nonce(self.nonce)
        if not isinstance(self.clusters, tuple | list) or not all(
            isinstance(c, str) and c for c in self.clusters
        ):
            raise InvalidError(f"expected cluster names, got {self.clusters!r}", path="clusters")
        force_setattr(self, "clusters", tuple(self.clusters))
        for rule, count in self.requeues.items():
            if isinstance(count, bool) or not isinstance(count, int) or count < 0:
                raise InvalidError(f"expected a count >= 0, got {count!r}", path=f"requeues[{rule!r}]")
        force_setattr(self, "requeues", frozen_map(self.requeues))

    def requeues_under(self, rule: str) -> int:
        """The requeues made under policy rule ``rule`` since the last submit or resubmit."""
        count = self.requeues.get(rule, 0)
        # A record written before budgets were counted per rule: every requeue is charged to each rule.
        return count if self.requeues or count else self.epoch.r

    @property
    def state(self) -> State:
        return self.outcome.state

    @property
    def identity(self) -> Identity:
        """The identity of the record's current incarnation."""
        return Identity(self.job_id, self.epoch, self.nonce)
