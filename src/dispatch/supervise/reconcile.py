"""What the cluster shows, matched to the records: :class:`Reconciler`.

A reading from the watch or from a listing goes to its record when the record is this supervisor's to
fold; an object of ours that matches no record follows :class:`UnmatchedPolicy`; the live compute of an
incarnation that no record wants any more (an old epoch, or a finished record's own) is stopped.
"""

from __future__ import annotations

import logging
from enum import StrEnum

from dispatch import decide
from dispatch.errors import ConflictError, InvalidError, NotFoundError
from dispatch.fold import matches
from dispatch.model import (
    Absent,
    Actor,
    Cause,
    Compute,
    JobRecord,
    JobSpec,
    Observation,
    Outcome,
    Policy,
    State,
    Transition,
)
from dispatch.records import Unreadable

from .acting import Acting
from .decisions import live, unwanted
from .folding import Folding
from .ground import Ground
from .leases import Leases
from .report import StepReport
from .view import ClusterView

__all__ = ["ADOPTED_COMMAND", "Reconciler", "UnmatchedPolicy"]

log = logging.getLogger("dispatch.supervise")

ADOPTED_COMMAND = ("dispatch-adopted",)
"""The command of a record adopted from a cluster object: its real spec is not known to dispatch."""


class UnmatchedPolicy(StrEnum):
    """What to do with a cluster object that carries dispatch's identity but matches no record."""

    IGNORE = "ignore"  # leave it alone (default): it may belong to another store
    ADOPT = "adopt"  # create a record for it (its spec unknown: it is never requeued)
    DELETE = "delete"  # stop it


class Reconciler:
    """Matches one supervisor's readings to records (see the module docstring); ``unmatched`` applies to
    objects without a record."""

    def __init__(
        self,
        ground: Ground,
        *,
        unmatched: UnmatchedPolicy,
        leases: Leases,
        view: ClusterView,
        folding: Folding,
        acting: Acting,
    ) -> None:
        self.ground = ground
        self.unmatched = unmatched
        self._leases = leases
        self._view = view
        self._folding = folding
        self._acting = acting
        self._unreadable: set[str] = set()  # job ids of unreadable records already reported

    async def change(self, jid: str, obs: Observation | Absent, *, report: StepReport) -> JobRecord | None:
        """Fold a reading into its record if the record is ours; the record after it when it is. An
        absent reading is folded once a second read confirms it."""
        leases = self._leases
        if not leases.concerns(jid):
            return None
        known = leases.known.get(jid) if jid in leases else None
        if known is not None:
            # Folded from the record as we last wrote or read it, without reading the store: if another
            # process wrote it since, the compare-and-swap refuses the write and the fold is retried on
            # the record read afresh. When the fold writes nothing, nothing is worked on from a copy
            # that may be stale (the next scan reads the record).
            got = await leases.own(known)
            if got is None:
                return None
            new = await self._folding.fold(got, obs, confirmed=False, report=report, read=True)
            return None if new is got else new
        try:
            rec = await self.ground.store.get(jid)
        except NotFoundError:
            if isinstance(obs, Observation):
                await self._unmatched(obs, report)
            return None
        except InvalidError as exc:  # an unreadable record: reported once, left alone
            self.unreadable(Unreadable(jid, exc.detail), report)
            return None
        if not self._folding.writer.owns(rec):
            return None
        if rec.outcome.terminal and decide.final(rec, self.ground.policy, self.ground.clock.now()):
            if isinstance(obs, Observation) and live(obs) and unwanted(rec, obs):
                got = await leases.own(rec)
                if got is not None:
                    await self._stop_unwanted(got, obs, report)
            return None
        got = await leases.own(rec)
        if got is None:
            return None
        return await self._folding.fold(got, obs, confirmed=False, report=report, read=True)

    async def listed(self, obs: Observation, known: dict[str, JobRecord], report: StepReport) -> None:
        """Reconcile one listed incarnation with ``known``, the records by job id."""
        ident = obs.handle.identity
        if not self._leases.mine(ident.job_id):
            return
        rec = known.get(ident.job_id)
        if rec is None:
            await self._unmatched(obs, report)
            return
        if not self._folding.writer.owns(rec):
            return  # another cluster's record: its own cluster's processes look after it
        if matches(rec, obs) and not rec.outcome.terminal:
            await self.change(ident.job_id, obs, report=report)
        elif live(obs) and unwanted(rec, obs):
            got = await self._leases.own(rec)
            if got is not None and unwanted(got, obs):
                await self._stop_unwanted(got, obs, report)

    def unreadable(self, bad: Unreadable, report: StepReport) -> None:
        """Name an unreadable record once (not at every step); it is left alone."""
        if bad.job_id not in self._unreadable:
            self._unreadable.add(bad.job_id)
            report.unreadable.append(str(bad))
            log.warning("%s", bad)

    async def _stop_unwanted(self, rec: JobRecord, obs: Observation, report: StepReport) -> None:
        """Stop compute no record wants; a finished record's own incarnation's leftovers (a terminal
        record never sits over live compute) are named in its history."""
        ident = obs.handle.identity
        if ident.epoch.n != rec.epoch.n:
            await self._acting.stop(obs.handle, report, why=f"no record wants {ident}")
            return
        # Read again before stopping anything of a finished job: a listing may lag (compute it shows
        # may be gone by now), and a stop deletes the incarnation's objects.
        again = await self._view.reader.observe(obs.handle)
        if not isinstance(again, Observation) or again.compute is not Compute.PRESENT:
            return
        obs = again
        stopped = await self._acting.stop(
            obs.handle, report, why=f"{ident} ended {rec.outcome} but its compute remains"
        )
        if stopped:
            why = f"{ident} ended {rec.outcome} and its compute was still there ({obs.outcome}): stopped it"
            now = self.ground.clock.now()
            await self._folding.update(
                rec.job_id,
                lambda r: (
                    decide.leftovers_stopped(r, why, actor=Actor.SUPERVISOR, now=now)
                    if r.epoch.n == ident.epoch.n
                    else None
                ),
            )

    async def _unmatched(self, obs: Observation, report: StepReport) -> None:
        ident = obs.handle.identity
        if self.unmatched is UnmatchedPolicy.IGNORE:
            return
        if self.unmatched is UnmatchedPolicy.DELETE:
            if not obs.outcome.terminal:
                await self._acting.stop(
                    obs.handle, report, why=f"{ident} matches no record (unmatched: delete)"
                )
            return
        now = self.ground.clock.now()
        rec = JobRecord(
            job_id=ident.job_id,
            spec=JobSpec(command=ADOPTED_COMMAND),
            created_at=now,
            updated_at=now,
            policy=Policy(),  # its spec is unknown here: never requeued, only followed
            epoch=ident.epoch,
            handle=obs.handle,
            cluster=self.ground.backend.cluster_id,
            # "cancelled" means we cancelled it; we did not (fold's rule).
            outcome=obs.outcome
            if obs.state is not State.CANCELLED
            else Outcome(State.FAILED, Cause.CANCELLED, obs.outcome.evidence),
        )
        first = Transition(
            at=now,
            actor=Actor.SUPERVISOR,
            what="adopted",
            why=f"{obs.handle} carries dispatch's identity and matched no record; its spec is unknown",
            state=obs.state,
            cause=obs.cause,
            epoch=ident.epoch,
        )
        try:
            await self.ground.store.create(rec, first)
            report.actions.append(f"{ident.job_id}: adopted {obs.handle}")
        except ConflictError:
            pass  # another supervisor adopted it first
