"""What every simulated run must hold (:mod:`dispatch.simulate`): :class:`Invariants`.

After every step and at the end: at most one live incarnation per job; no two incarnations' compute
overlaps; every terminal record has a typed cause; no record is lost; no acknowledged submission is
dropped; every requeue is allowed by the policy (rule, count, backoff); the history is append-only and
explains the record's state and epoch; no state goes back within an incarnation; no terminal record sits
over live compute longer than the stop grace; nobody else's cancel is invented. The cluster's side comes
from the run's harness (:class:`Facts`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Protocol

from dispatch import decide
from dispatch.clock import Clock
from dispatch.model import Action, Actor, Cause, Identity, JobRecord, Policy, State, Transition
from dispatch.records import Store

__all__ = ["Facts", "Invariants"]


class Facts(Protocol):
    """What a harness reports about its cluster, for the invariants to be checked against."""

    others_stop: bool
    """Whether someone else stops jobs on this cluster (a deletion seen under way ends ``failed``/
    ``cancelled``); where nobody does, such an outcome would be dispatch stopping what it should not."""

    def live(self) -> list[Identity]:
        """The incarnations that are on the cluster and not yet ended."""

    def on_cluster(self) -> set[Identity]:
        """Every incarnation the cluster shows (ended or not)."""

    def with_compute(self) -> set[Identity]:
        """Every incarnation with compute on the cluster now (running, or lingering after its end)."""

    def created(self, job_id: str) -> list[Identity]:
        """Every incarnation of ``job_id`` ever created, once per creation."""

    def overlaps(self) -> list[tuple[str, str]]:
        """Every compute overlap seen so far, as (job id, what overlapped): two incarnations of one job
        with compute at once."""


class Invariants:
    """The invariants of one run (see the module docstring): ``policy``, ``lease`` and ``poll`` are the
    run's; ``note`` adds a line to its trace. The violations found are kept in :attr:`violations`."""

    def __init__(
        self,
        facts: Facts,
        clock: Clock,
        *,
        policy: Policy,
        lease: float,
        poll: float,
        note: Callable[[str], None],
    ) -> None:
        self.facts = facts
        self.clock = clock
        self.policy = policy
        self.lease = lease
        self.poll = poll
        self._note = note
        self.histories: dict[str, list[Transition]] = {}
        self.violations: list[tuple[str, str]] = []  # (job id or "", message)

    def forget(self, job_id: str) -> None:
        """The record was purged: its history goes with it."""
        self.histories.pop(job_id, None)

    def violate(self, job_id: str, message: str) -> None:
        """Note a violation (once) about ``job_id`` (``""``: the run's)."""
        if (job_id, message) not in self.violations:
            self.violations.append((job_id, message))
            self._note(f"VIOLATION {message}")

    async def check(
        self,
        store: Store,
        *,
        acked: set[str],
        purged: set[str],
        back_at: float,
        unattended: Mapping[str, float] | None = None,
        final: bool = False,
    ) -> None:
        """Check every invariant now (``final``: at the end of the run) against the cluster's facts and
        ``store``: ``acked`` the acknowledged submissions, ``purged`` those the user purged since,
        ``back_at`` when the supervisors came back from a long absence, ``unattended`` when each job was
        last left to nobody (every running supervisor at its capacity with other jobs)."""
        unattended = unattended or {}
        now = self.clock.now()
        live: dict[str, list[Identity]] = {}
        for ident in self.facts.live():
            live.setdefault(ident.job_id, []).append(ident)
        for job_id, idents in live.items():
            if len(idents) > 1:
                self.violate(
                    job_id, f"{job_id}: {len(idents)} live incarnations: {', '.join(map(str, idents))}"
                )
        for job_id, what in self.facts.overlaps():
            self.violate(job_id, f"compute overlap: {what}")
        records = {r.job_id: r for r in await store.list()}
        on_cluster = self.facts.on_cluster()
        with_compute = self.facts.with_compute()
        for rec in records.values():
            if rec.state is State.LOST and rec.identity in on_cluster:
                self.violate(
                    rec.job_id, f"{rec.job_id}: recorded lost, but {rec.job_id}@{rec.epoch} is on the cluster"
                )
            # A terminal record never sits over live compute: it is written only once a reading finds
            # the compute gone, and compute that comes back is stopped within the stop grace.
            since = rec.since if rec.since is not None else rec.updated_at
            grace = decide.STOP_GRACE + decide.STOP_RESEND + self.lease + 2 * self.poll + 10.0
            if (
                rec.outcome.terminal
                and rec.identity in with_compute
                and now - max(since, unattended.get(rec.job_id, since)) > grace
            ):
                self.violate(
                    rec.job_id,
                    f"{rec.job_id}: {rec.outcome} for {now - since:.0f} s while {rec.identity} has compute",
                )
            # Nor does an ended incarnation keep its compute for long: past the grace the supervisor stops
            # what remains (counted from when some supervisor could have seen it).
            seen_since = max(since, back_at, unattended.get(rec.job_id, since))
            if rec.state is State.STOPPING and now - seen_since > grace + 240.0:
                self.violate(
                    rec.job_id,
                    f"{rec.job_id}: stopping for {now - since:.0f} s: what remains of {rec.identity} was never stopped",
                )
        for job_id in acked - purged:
            if job_id not in records:
                self.violate(job_id, f"{job_id}: acknowledged, but its record is gone")
        for job_id, rec in records.items():
            self._check_record(rec, await store.history(job_id), final=final, now=now)

    def _check_record(self, rec: JobRecord, history: list[Transition], *, final: bool, now: float) -> None:
        jid = rec.job_id
        old = self.histories.get(jid, [])
        if history[: len(old)] != old:
            self.violate(jid, f"{jid}: history rewritten (was {len(old)} entries)")
        self.histories[jid] = history
        o = rec.outcome
        if o.terminal:
            typed = {
                State.SUCCEEDED: o.cause is Cause.NONE,
                State.CANCELLED: o.cause is Cause.CANCELLED,
                State.FAILED: o.cause is not Cause.NONE,
                State.LOST: True,
            }[o.state]
            if not typed:
                self.violate(jid, f"{jid}: terminal {o.state.value} with cause {o.cause.value}")
        stateful = [t for t in history if t.state is not None]
        if o.state is State.FAILED and o.cause is Cause.CANCELLED and not self.facts.others_stop:
            # Nobody but dispatch stops jobs on this cluster: "cancelled by someone else" would be dispatch
            # stopping a job its record did not want stopped (a reading during an outage, say).
            self.violate(jid, f"{jid}: failed/cancelled, yet nobody else cancels jobs here")
        self._check_forward(jid, stateful)
        last = stateful[-1] if stateful else None
        if last is None or last.state is not rec.state or (last.cause or Cause.NONE) is not o.cause:
            shown = f"{last.state}/{last.cause}" if last is not None else "nothing"
            self.violate(jid, f"{jid}: record {rec.state.value}/{o.cause.value} but history says {shown}")
        epochs = [t.epoch for t in history if t.epoch is not None]
        if not epochs or epochs[-1] != rec.epoch:
            self.violate(jid, f"{jid}: record epoch {rec.epoch} not explained by its history")
        policy = rec.policy if rec.policy is not None else self.policy
        counts: dict[str, int] = {}  # requeues under each rule since the last (re)submission
        for i, t in enumerate(history):
            if t.what in ("submitted", "resubmitted"):
                counts = {}
            if t.what != "requeued":
                continue
            before = [p for p in history[:i] if p.state is not None]
            cause = before[-1].cause if before else None
            prev_epoch = next((p.epoch for p in reversed(history[:i]) if p.epoch is not None), None)
            rule = policy.rule_for(cause) if cause is not None else None
            assert t.epoch is not None
            name = policy.rule_name(cause) if cause is not None else ""
            k = counts[name] = counts.get(name, 0) + 1
            allowed = policy.max_requeues is None or t.epoch.r <= policy.max_requeues
            if rule is None or rule.action is not Action.REQUEUE or k > rule.max or not allowed:
                self.violate(jid, f"{jid}: requeue to {t.epoch} after {cause} not allowed by the policy")
                continue
            if prev_epoch is None or prev_epoch.requeued() != t.epoch:
                self.violate(jid, f"{jid}: requeue from {prev_epoch} to {t.epoch} skips an epoch")
            # The placer's own line (a fold that found the object first writes one too, on its own
            # clock, which may disagree with the placer's).
            start = next(
                (
                    s
                    for s in history[i:]
                    if s.what == "started" and s.epoch == t.epoch and s.actor is not Actor.CLUSTER
                ),
                None,
            )
            if start is not None and start.at + 1e-9 < t.at + rule.delay(k):
                self.violate(jid, f"{jid}: {t.epoch} started before its backoff of {rule.delay(k):g} s")
        created = self.facts.created(jid)
        for ident in created:
            if ident.epoch.n > rec.epoch.n:
                self.violate(jid, f"{jid}: {ident} exists but the record is at {rec.epoch}")
        ns = [i.epoch.n for i in created]
        if len(ns) != len(set(ns)):
            self.violate(jid, f"{jid}: an incarnation was created twice: {ns}")

    def _check_forward(self, jid: str, stateful: list[Transition]) -> None:
        """Within one incarnation the state never goes back (SPEC §2.3): ``held`` comes and goes by a
        person's hold and release, and a cancel, which turns a record back to ``stopping``, is a stop."""
        for before, after in itertools.pairwise(stateful):
            if before.epoch != after.epoch or before.state is None or after.state is None:
                continue
            if State.HELD in (before.state, after.state) and before.state is not State.STOPPING:
                continue
            if after.state.rank < before.state.rank:
                self.violate(
                    jid,
                    f"{jid}: {before.state.value} then {after.state.value} within incarnation {after.epoch}",
                )

    def report(self, trace: list[str]) -> list[str]:
        """Each violation with the lines of ``trace`` that concern it."""
        out = []
        for job_id, message in self.violations:
            lines = [ln for ln in trace if (job_id and job_id in ln) or "CRASH" in ln or "VIOLATION" in ln]
            out.append(f"{message}\n" + "\n".join(f"    {ln}" for ln in lines[-40:]))
        return out
