"""Job records: what the store keeps for every job, and its history of transitions."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dispatch.model._decode import Fields, as_bool, as_enum, as_int, as_number, as_str
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


@dataclass(frozen=True, slots=True)
class Lease:
    """A time-bounded claim on a record by one supervisor; expired leases may be taken over."""

    holder: str
    expires_at: float

    def live(self, now: float) -> bool:
        return now < self.expires_at

    def to_json(self) -> dict[str, Any]:
        return {"holder": self.holder, "expiresAt": self.expires_at}

    @classmethod
    def from_json(cls, value: Any, path: str = "lease") -> Lease:
        f = Fields(value, path)
        lease = cls(f.required("holder", as_str), f.required("expiresAt", as_number))
        f.done()
        return lease


@dataclass(frozen=True, slots=True)
class Transition:
    """One entry of a record's append-only history: what changed, why, and by whom."""

    at: float
    actor: Actor
    what: str
    why: str = ""
    state: State | None = None
    cause: Cause | None = None
    epoch: Epoch | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"at": self.at, "actor": self.actor.value, "what": self.what}
        if self.why:
            out["why"] = self.why
        if self.state is not None:
            out["state"] = self.state.value
        if self.cause is not None:
            out["cause"] = self.cause.value
        if self.epoch is not None:
            out["epoch"] = str(self.epoch)
        return out

    @classmethod
    def from_json(cls, value: Any, path: str = "transition") -> Transition:
        f = Fields(value, path)
        t = cls(
            at=f.required("at", as_number),
            actor=f.required("actor", lambda v, p: as_enum(Actor, v, p)),
            what=f.required("what", as_str),
            why=f.optional("why", as_str, ""),
            state=f.optional("state", lambda v, p: as_enum(State, v, p), None),
            cause=f.optional("cause", lambda v, p: as_enum(Cause, v, p), None),
            epoch=f.optional("epoch", Epoch.parse, None),
        )
        f.done()
        return t


@dataclass(frozen=True, slots=True)
class JobRecord:
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
    revision: int = 0
    lease: Lease | None = None

    def __post_init__(self) -> None:
        check_job_id(self.job_id)

    def replace(self, **changes: Any) -> JobRecord:
        """A copy with ``changes`` applied (the revision is the store's business, not the caller's)."""
        return dataclasses.replace(self, **changes)

    @property
    def state(self) -> State:
        return self.outcome.state

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "jobId": self.job_id,
            "spec": self.spec.to_json(),
            "epoch": str(self.epoch),
            "outcome": self.outcome.to_json(),
            "revision": self.revision,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
        }
        if self.policy is not None:
            out["policy"] = self.policy.to_json()
        if self.handle is not None:
            out["handle"] = self.handle.to_json()
        if self.hold_token is not None:
            out["holdToken"] = self.hold_token
        if self.plan is not None:
            out["plan"] = self.plan.to_json()
        if self.cancel_requested:
            out["cancelRequested"] = True
        if self.hold_requested:
            out["holdRequested"] = True
        if self.unknown_write is not None:
            out["unknownWrite"] = self.unknown_write
        if self.lease is not None:
            out["lease"] = self.lease.to_json()
        return out

    @classmethod
    def from_json(cls, value: Any, path: str = "") -> JobRecord:
        f = Fields(value, path)
        rec = cls(
            job_id=f.required("jobId", check_job_id),
            spec=f.required("spec", JobSpec.from_json),
            created_at=f.required("createdAt", as_number),
            updated_at=f.required("updatedAt", as_number),
            policy=f.optional("policy", Policy.from_json, None),
            epoch=f.required("epoch", Epoch.parse),
            handle=f.optional("handle", Handle.from_json, None),
            outcome=f.required("outcome", Outcome.from_json),
            hold_token=f.optional("holdToken", as_str, None),
            plan=f.optional("plan", Plan.from_json, None),
            cancel_requested=f.optional("cancelRequested", as_bool, False),
            hold_requested=f.optional("holdRequested", as_bool, False),
            unknown_write=f.optional("unknownWrite", as_str, None),
            revision=f.required("revision", as_int),
            lease=f.optional("lease", Lease.from_json, None),
        )
        f.done()
        return rec
