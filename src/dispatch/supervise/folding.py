"""How a supervisor writes records: :class:`Folding` — readings folded in, and every write under its lease.

Every record write of a supervisor goes through :meth:`Folding.update`: the one compare-and-swap loop
(:class:`~dispatch.writer.RecordWriter`), only while the supervisor's lease is live. A reading is folded
with :func:`dispatch.fold.fold`; an absent one only once a second, complete answer confirms it
(:meth:`dispatch.reader.Reader.confirm`), and a cluster that does not answer changes nothing.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable

from dispatch import decide, metrics
from dispatch.backend import record_decision
from dispatch.errors import UnavailableError
from dispatch.fold import folded, matches
from dispatch.model import Absent, Cause, JobRecord, Observation, Policy, State, Transition, Unreachable
from dispatch.writer import LeaseLostError, RecordWriter

from .ground import Ground
from .leases import Leases
from .report import StepReport
from .view import ClusterView

__all__ = ["Folding"]


class Folding:
    """Folds readings into the records a supervisor leases, and writes them (see the module docstring)."""

    def __init__(self, ground: Ground, *, leases: Leases, view: ClusterView) -> None:
        self.ground = ground
        self._leases = leases
        self._view = view
        self.writer = RecordWriter(
            ground.store,
            ground.backend,
            ground.clock,
            holder=ground.holder,
            lease_until=leases.lease_until,
            on_write=self._written,
        )

    async def update(
        self, jid: str, change: Callable[[JobRecord], decide.Step | None], *, current: JobRecord | None = None
    ) -> JobRecord:
        """The one compare-and-swap loop (:meth:`RecordWriter.update`), only while we hold the lease.
        ``current``: the record as last read or written here, to start from without reading it again
        (a stale one costs a compare-and-swap retry, never a wrong write)."""
        try:
            after = await self.writer.update(jid, change, current=current)
        except LeaseLostError:
            self._leases.lost(jid)
            raise
        self._leases.remember(after)
        return after

    def _written(
        self, before: JobRecord, after: JobRecord, transitions: builtins.list[Transition], now: float
    ) -> None:
        """After each record write of ours: remember the record as written, and count it."""
        self._leases.remember(after)
        count(before, after, now, self.ground.policy)

    async def fold(
        self,
        rec: JobRecord,
        obs: Observation | Absent,
        *,
        confirmed: bool,
        report: StepReport,
        read: bool = False,
    ) -> JobRecord:
        """Fold ``obs`` into ``rec``; ``read``: ``rec`` was just read from the store (the write then
        starts from it rather than reading it again; a stale one only costs a compare-and-swap retry).
        An absent reading not yet ``confirmed`` is read again over a fresh listing first (two absent
        readings, or the listed observation); a cluster that does not answer changes nothing."""
        jid = rec.job_id
        if isinstance(obs, Absent) and not confirmed and matches(rec, obs):
            self._view.forget_listing()
            listed = await self._view.reader.listing()
            if isinstance(listed, Unreachable):
                return rec
            self._view.keep_listing(listed)
            second = await self._view.reader.confirm(obs, listed)
            if isinstance(second, Unreachable):
                return rec
            obs = second
        now = self.ground.clock.now()
        try:
            new = await self.update(
                jid, lambda r: folded(r, obs, now=now, confirmed=True), current=rec if read else None
            )
        except LeaseLostError:
            return rec
        if new.revision != rec.revision:
            report.folded += 1
            if new.outcome.terminal and not rec.outcome.terminal and new.outcome.cause is not Cause.NONE:
                await record_decision(
                    self.ground.backend,
                    obs.handle,
                    "CauseRead",
                    _cause_read(new),
                    warning=new.state in (State.FAILED, State.LOST),
                )
        return new

    async def refresh(self, rec: JobRecord, report: StepReport) -> JobRecord:
        """Read the record's current incarnation (by handle, else by identity) and fold it. A cluster
        that does not answer raises ``UnavailableError``: nothing is decided on a record not read."""
        handle = decide.current_handle(rec)
        got: Observation | Absent | Unreachable | None
        if handle is not None:
            got = await self._view.reader.observe(handle)
        elif rec.unknown_write is None and decide.previous_handle(rec) is None and rec.handle is None:
            got = await self._view.find(rec)
        else:
            return rec  # a start whose effect is unknown, or a requeue under way: their plans read
        if isinstance(got, Unreachable):
            raise UnavailableError(f"job {rec.job_id}: the cluster does not answer ({got})")
        if got is None:
            return rec
        return await self.fold(rec, got, confirmed=False, report=report)


def count(before: JobRecord, after: JobRecord, now: float, policy: Policy) -> None:
    """Metrics of one record write: a requeue, an incarnation placed, an outcome become final (under
    ``policy`` for a record without its own)."""
    recorder = metrics.current()
    if not recorder.enabled:
        return
    if after.epoch.r > before.epoch.r and after.epoch.n > before.epoch.n:
        cause = before.outcome.cause
        rule_policy = before.policy if before.policy is not None else policy
        rule = cause.value if cause in rule_policy.rules else "default"
        recorder.inc("dispatch_requeues_total", {"cause": cause.value, "rule": rule})
    if (
        after.handle is not None
        and after.handle != before.handle
        and after.handle.identity.epoch.n == after.epoch.n
    ):
        recorder.inc("dispatch_incarnations_started_total")
    # Only a terminal record can be final: most writes (starting, running) skip the decision.
    if (
        after.outcome.terminal
        and decide.final(after, policy, now)
        and not (before.outcome.terminal and decide.final(before, policy, now))
    ):
        recorder.inc(
            "dispatch_outcomes_total", {"state": after.state.value, "cause": after.outcome.cause.value}
        )


def _cause_read(rec: JobRecord) -> str:
    """The message of a ``CauseRead`` decision: the outcome, its cause and the first evidence."""
    first = rec.outcome.evidence[0] if rec.outcome.evidence else None
    seen = f" ({first.kind} {first.name}: {first.reason} {first.message})".rstrip() if first else ""
    return f"job {rec.job_id} epoch {rec.epoch}: {rec.state.value}, cause {rec.outcome.cause.value}{seen}"
