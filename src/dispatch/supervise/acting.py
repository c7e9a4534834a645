"""How a supervisor acts on a record: :class:`Acting` — decide the next action, perform it, record it.

For one leased record, :func:`dispatch.decide.next` gives the one action; it is performed through the
backend and recorded (:class:`~dispatch.supervise.folding.Folding`), then the next, until the record
waits on the cluster or on time. Nothing blocks: a previous incarnation whose compute lingers is checked
again at a later step. A failed action is retried at a later step, after a doubling delay for a
temporary error and a long one for a permanent error (:func:`dispatch.decide.classify`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dispatch import decide
from dispatch.backend import record_decision
from dispatch.errors import (
    DispatchError,
    InvalidError,
    NotFoundError,
    OutcomeUnknownError,
    UnavailableError,
    UnsupportedError,
)
from dispatch.model import Actor, Handle, JobRecord, Observation, Plan, PlanAction, Unreachable
from dispatch.writer import LeaseLostError

from .decisions import same
from .folding import Folding
from .ground import Ground
from .leases import Leases, Retry
from .report import StepReport
from .view import ClusterView

__all__ = ["MAX_ACTIONS", "Acting"]

log = logging.getLogger("dispatch.supervise")

MAX_ACTIONS = 8
"""Actions taken for one record in one step before moving on (a requeue is four or five)."""


class Acting:
    """Works on the records a supervisor leases (see the module docstring). ``poll``: how soon a stop is
    sent again, and lingering compute checked again; ``soon(at)`` asks the supervisor's loop to scan
    again no later than ``at``."""

    def __init__(
        self,
        ground: Ground,
        *,
        poll: float,
        leases: Leases,
        view: ClusterView,
        folding: Folding,
        soon: Callable[[float], None],
    ) -> None:
        self.ground = ground
        self.poll = poll
        self._leases = leases
        self._view = view
        self._folding = folding
        self._soon = soon
        self._stopped: dict[str, float] = {}  # native ref -> when we asked it to stop

    async def work(
        self, jid: str, report: StepReport, *, rec: JobRecord | None = None, poll: bool = False
    ) -> None:
        """Take the next actions for one record until it waits (observing it first when ``poll``); a
        failed action is retried later (see the module docstring)."""
        leases = self._leases
        retry = leases.retry.get(jid)
        if retry is not None and self.ground.clock.now() < retry.not_before:
            return
        if rec is not None:
            rec = leases.newest(rec)
        try:
            await self._work_on(jid, report, rec, poll)
            leases.retry.pop(jid, None)
        except LeaseLostError:
            return
        except NotFoundError:  # the record was purged
            leases.forget(jid)
            return
        except DispatchError as exc:
            verdict = decide.classify(exc)
            report.errors.append(f"{jid}: {verdict}")
            attempts = leases.retry[jid].attempts + 1 if jid in leases.retry else 1
            if isinstance(verdict, decide.TemporaryError):
                delay = min(verdict.delay * 2 ** min(attempts - 1, 10), 300.0)
            else:
                delay = 300.0
            leases.retry[jid] = Retry(attempts, self.ground.clock.now() + delay)
            log.info("job %s: %s; next try in %g s", jid, verdict, delay)

    async def _work_on(self, jid: str, report: StepReport, rec: JobRecord | None, poll: bool) -> None:
        self._leases.quiet.pop(jid, None)
        if rec is None:
            rec = await self.ground.store.get(jid)
        got = await self._leases.own(rec)
        if got is None:
            return
        rec = got
        # Observe first when polling, and when the record was someone else's until now.
        if (poll or jid in self._leases.fresh) and not rec.outcome.terminal:
            rec = await self._folding.refresh(rec, report)
            self._leases.fresh.discard(jid)  # only once observed: a failed refresh is tried again
        for _ in range(MAX_ACTIONS):
            now = self.ground.clock.now()
            plan = decide.next(rec, self.ground.policy, now)
            if plan.action is PlanAction.DONE:
                await self._leases.let_go(jid)
                return
            if plan.action is PlanAction.WAIT:
                if plan.not_before is None and not poll:  # only a change of the record or cluster ends it
                    self._leases.quiet[jid] = rec.revision
                return
            report.actions.append(f"{jid}@{rec.epoch}: {plan.action.value} ({plan.reason})")
            log.info(
                "%s %s@%s: %s",
                plan.action.value,
                jid,
                rec.epoch,
                plan.reason,
                extra={
                    "job_id": jid,
                    "epoch": str(rec.epoch),
                    "action": plan.action.value,
                    "cause": rec.outcome.cause.value,
                },
            )
            after = await self._act(rec, plan, report)
            if after is None:
                return
            rec = after

    async def _act(self, rec: JobRecord, plan: Plan, report: StepReport) -> JobRecord | None:
        """Perform ``plan`` for ``rec``; the record after it, or ``None`` to wait for a later step."""
        jid = rec.job_id
        now = self.ground.clock.now()
        action = plan.action
        update = self._folding.update
        if action is PlanAction.REQUEUE:
            after = await update(
                jid, lambda r: decide.requeued(r, plan, now=now) if same(rec, r) else None, current=rec
            )
            if after.revision != rec.revision:
                why = f"job {jid} epoch {rec.epoch}: requeued as epoch {after.epoch}: {plan.reason}"
                await record_decision(self.ground.backend, decide.current_handle(rec), "Requeued", why)
            return after
        if action in (PlanAction.FAIL, PlanAction.HOLD):
            after = await update(
                jid, lambda r: decide.gave_up(r, plan, now=now) if same(rec, r) else None, current=rec
            )
            if after.revision != rec.revision:
                reason = "GaveUp" if action is PlanAction.FAIL else "HeldByPolicy"
                why = f"job {jid} epoch {rec.epoch}: {plan.reason}"
                await record_decision(self.ground.backend, rec.handle, reason, why, warning=True)
            return after
        if action is PlanAction.SETTLE:
            return await self._settle(rec, report)
        if action is PlanAction.CEASE:
            return await self._cease(rec, report)
        if action is PlanAction.STOP:
            if rec.cancel_requested:
                return await self._cancel(rec, report)
            return await self._reap(rec, plan, report)
        if action is PlanAction.START:
            return await self._start(rec, report)
        raise InvalidError(f"no way to perform {action.value}", path="plan.action")  # pragma: no cover

    async def _settle(self, rec: JobRecord, report: StepReport) -> JobRecord | None:
        """A write's effect is unknown: look the identity up on the cluster and fold what is there."""
        self._view.forget_listing()  # a fresh listing: the one kept may predate the write
        found = await self._view.find(rec)
        if found is not None:
            return await self._folding.fold(rec, found, confirmed=True, report=report)
        prev = decide.previous_handle(rec)
        if prev is not None:
            obs = await self._view.reader.observe(prev)
            if isinstance(obs, Unreachable):
                raise UnavailableError(f"job {rec.job_id}: the cluster does not answer ({obs})")
            why = f"observed {prev.identity}: {obs.state.value if isinstance(obs, Observation) else 'absent'}"
        else:
            why = f"no object carries {rec.job_id}@{rec.epoch}: it did not take effect"
        now = self.ground.clock.now()
        return await self._folding.update(
            rec.job_id, lambda r: decide.settled(r, why, now=now) if same(rec, r) else None
        )

    async def stop(self, handle: Handle, report: StepReport, *, why: str) -> bool:
        """Stop an incarnation (idempotent); a lost response is settled by the next observation. Whether
        a stop was sent now (not within a poll of the last one)."""
        now = self.ground.clock.now()
        asked = self._stopped.get(handle.ref)
        if asked is not None and now - asked < self.poll:
            return False
        try:
            await self.ground.backend.stop(handle)
        except OutcomeUnknownError as exc:
            report.errors.append(f"stop {handle.identity}: {exc}")
        except DispatchError as exc:
            report.errors.append(f"stop {handle.identity}: {exc}")
            return False
        self._stopped[handle.ref] = now
        report.actions.append(f"{handle.identity.job_id}: stopped {handle.identity} ({why})")
        return True

    async def _reap(self, rec: JobRecord, plan: Plan, report: StepReport) -> JobRecord | None:
        """Stop what remains of an incarnation that ended on the cluster (see ``decide._reap``): recorded
        first, then sent; its outcome stays the cluster's."""
        handle = decide.current_handle(rec)
        if handle is None:
            return None
        now = self.ground.clock.now()
        after = await self._folding.update(
            rec.job_id, lambda r: decide.stop_asked(r, plan, now=now) if same(rec, r) else None, current=rec
        )
        if after.revision != rec.revision:
            self._stopped.pop(handle.ref, None)
            await self.stop(handle, report, why=plan.reason)
        return None

    async def _cease(self, rec: JobRecord, report: StepReport) -> JobRecord | None:
        prev = decide.previous_handle(rec)
        assert prev is not None
        if not await self._view.gone(prev):
            await self.stop(prev, report, why=f"requeue of {rec.job_id} to {rec.epoch}")
            if not await self._view.gone(prev):
                self._soon(self.ground.clock.now() + self.poll)
                return None  # pods linger: check again at a later step, never block the loop
        now = self.ground.clock.now()
        self._stopped.pop(prev.ref, None)
        return await self._folding.update(rec.job_id, lambda r: decide.ceased(r, prev, now=now), current=rec)

    async def _cancel(self, rec: JobRecord, report: StepReport) -> JobRecord | None:
        handle = decide.current_handle(rec)
        if handle is None:
            found = await self._view.find(rec)
            if found is not None:  # started before a crash, the handle never recorded
                rec = await self._folding.fold(rec, found, confirmed=True, report=report)
                handle = found.handle
        now = self.ground.clock.now()
        if handle is None:
            return await self._folding.update(
                rec.job_id,
                lambda r: (
                    decide.cancelled_off_cluster(r, actor=Actor.SUPERVISOR, now=now) if same(rec, r) else None
                ),
            )
        if rec.outcome.terminal:
            return rec
        if handle.ref not in self._stopped:  # one Event, not one per step until the stop is done
            # Told before the stop: a stop deletes the TrainJob, and an Event is recorded on a live object.
            why = (
                f"job {rec.job_id} epoch {rec.epoch}: carrying out the cancel request; stopping {handle.ref}"
            )
            await record_decision(self.ground.backend, handle, "Cancelled", why)
        await self.stop(handle, report, why="cancel requested")
        obs = await self._view.reader.observe(handle)
        if isinstance(obs, Unreachable):
            return None
        after = await self._folding.fold(rec, obs, confirmed=False, report=report)
        return None if not after.outcome.terminal else after

    async def _start(self, rec: JobRecord, report: StepReport) -> JobRecord | None:
        placed = await self._place(rec, report)
        if placed is None:
            return None
        rec = placed
        identity = rec.identity
        try:
            prepared = await self.ground.backend.prepare(rec.spec, identity, held=False)
        except (InvalidError, UnsupportedError) as exc:  # what the cluster cannot run fails the job
            refused, now = exc, self.ground.clock.now()
            return await self._folding.update(
                rec.job_id,
                lambda r: decide.start_refused(r, identity, refused, now=now) if same(rec, r) else None,
            )
        # A failed start is retried at a later step: nothing is written for it (record_failures).
        after, handle = await self._folding.writer.start(
            prepared, actor=Actor.SUPERVISOR, record_failures=False, current=rec
        )
        if handle is not None and identity.epoch.r > 0 and after.handle == handle:
            # The requeue told on the new incarnation too: the old TrainJob is usually deleted by now.
            why = f"job {rec.job_id} epoch {identity.epoch}: placed as a requeue"
            why += f": {rec.plan.reason}" if rec.plan is not None and rec.plan.reason else ""
            await record_decision(self.ground.backend, handle, "Requeued", why)
        moved = after.cancel_requested or after.outcome.terminal or after.epoch.n != identity.epoch.n
        if handle is not None and moved:
            # Cancelled (or resubmitted) while it was being placed: the new incarnation is not wanted.
            await self.stop(handle, report, why="placed after its record moved on")
        return after

    async def _place(self, rec: JobRecord, report: StepReport) -> JobRecord | None:
        """In a fleet, the record once its incarnation is placed on this cluster; ``None`` when it went to
        another (the last write of this cluster on it: its lease is given back) or when no cluster takes
        it now (tried again at a later step)."""
        placer = self.ground.placer
        here = self.ground.backend.cluster_id
        if placer is None or (rec.plan is not None and rec.plan.placed == here and rec.cluster == here):
            return rec
        placement = await placer.place(rec)
        if placement.chosen is None or not placement.chosen.identity:
            report.actions.append(f"{rec.job_id}@{rec.epoch}: waits ({placement.why})")
            self._soon(self.ground.clock.now() + self.poll)
            return None
        there = placement.chosen.identity
        now = self.ground.clock.now()
        after = await self._folding.update(
            rec.job_id,
            lambda r: decide.placed(r, there, placement.why, now=now) if same(rec, r) else None,
            current=rec,
        )
        if after.revision == rec.revision:
            return None
        report.actions.append(f"{rec.job_id}@{rec.epoch}: {placement.why}")
        if there != here:
            await self._leases.let_go(rec.job_id)
            return None
        return after
