"""Folding what the cluster reports into a job record: the pure function :func:`fold`.

Every process — the facade (``Cluster.get``/``list``/``watch``), the supervisor, a command run a minute
later — folds readings into records through this one function, so every path agrees on what a reading
means for a record. The rules of truth (SPEC §2.3, §5) live here, not in the adapters:

- **terminal only once the compute is gone**: a reading that says the incarnation ended while some of
  its compute is still there (pods terminating, Slurm steps completing) is ``stopping``, with the cause
  it will end with;
- **no going back within an incarnation**: a reading of a lower state than the record's (the real
  controllers show a failing job ``starting`` for a moment before ``failed``) keeps the record's state
  and takes the reading's cause and evidence;
- **a stop is remembered by the record, not by a process**: once the user asked to cancel, every reading
  of the incarnation folds to ``stopping`` and then ``cancelled`` — whichever process reads it;
- **only two absent readings conclude** ``lost`` (the caller confirms; an unconfirmed one is ignored);
- **unreachable changes nothing**: it never reaches this function.
"""

from __future__ import annotations

from dispatch.model import (
    Absent,
    Actor,
    Cause,
    Compute,
    Evidence,
    JobRecord,
    Observation,
    Outcome,
    PlanAction,
    State,
    Transition,
)

__all__ = ["fold", "folded", "matches", "progress", "refines", "remembered"]


def matches(record: JobRecord, reading: Observation | Absent) -> bool:
    """True when ``reading`` is of the record's *current* incarnation: same job id, same ``N``, same
    nonce (an object left by a purged record, or by another store's record of the same job id, is not
    this record's).

    Readings of older incarnations (a requeued or resubmitted job's previous object, still terminating)
    and of other jobs say nothing about the record's present, so they are not folded.
    """
    return reading.handle.identity.same_incarnation(record.identity)


def folded(
    record: JobRecord, reading: Observation | Absent, *, now: float, confirmed: bool = False
) -> tuple[JobRecord, list[Transition]] | None:
    """:func:`fold` as a record change for :meth:`dispatch.writer.RecordWriter.update`: ``None`` when the
    reading changes nothing (nothing to write)."""
    new, transitions = fold(record, reading, now=now, confirmed=confirmed)
    return None if new is record else (new, transitions)


def fold(
    record: JobRecord, reading: Observation | Absent, *, now: float, confirmed: bool = False
) -> tuple[JobRecord, list[Transition]]:
    """Fold one reading into a record; return the new record and the transitions to append.

    - a reading of another job or incarnation than the record's current one is ignored;
    - a terminal record stays as it is — except that a ``failed``/``unknown`` record not yet given up
      takes the cause a later reading of the same incarnation finds (:func:`refines`: the cluster's
      objects arrive on separate streams, so a job's ``Failed`` may be read before the pod that says why);
    - an :class:`~dispatch.model.Absent` reading concludes only when ``confirmed`` (a second complete
      answer agreed): ``cancelled`` when the user asked to cancel, the cause the record was stopping with
      when it was stopping, else ``lost``/``unknown``;
    - a seen reading is folded by :func:`progress` (stopping, no going back, the remembered cause);
    - a record without a handle of its current incarnation takes the reading's, and the history says it
      was started (so every placed incarnation has its ``started`` line, whoever wrote it first);
    - an observation of the current incarnation settles a write whose outcome was unknown;
    - nothing changed → the record as it is, no transition; new evidence for the same state and cause
      updates the record without a transition (the history records what changed).

    Transitions are by actor ``cluster`` and carry the new state, cause and epoch.
    """
    if not matches(record, reading):
        return record, []
    if isinstance(reading, Absent):
        if not confirmed or record.outcome.terminal:
            return record, []
        observed = _concluded(record, reading)
    elif record.outcome.terminal:
        if not refines(record, reading.outcome):
            return record, []
        observed = Outcome(
            State.FAILED, reading.outcome.cause, (*record.outcome.evidence, *reading.outcome.evidence)
        )
    else:
        observed = progress(record, reading)
    handle = record.handle
    transitions: list[Transition] = []
    if handle is None or handle.identity.epoch.n != record.epoch.n:
        handle = reading.handle
        transitions.append(
            Transition(
                at=now,
                actor=Actor.CLUSTER,
                what="started",
                why=f"{handle} (found on the cluster)",
                epoch=record.epoch,
            )
        )
    if observed == record.outcome and handle == record.handle and record.unknown_write is None:
        return record, []
    new = record.replace(outcome=observed, handle=handle, unknown_write=None, updated_at=now)
    if record.unknown_write is not None:
        transitions.append(
            Transition(
                at=now,
                actor=Actor.CLUSTER,
                what="settled",
                why=f"observed {reading.handle}: {record.unknown_write}",
                epoch=record.epoch,
            )
        )
    if (observed.state, observed.cause) != (record.outcome.state, record.outcome.cause):
        transitions.append(
            Transition(
                at=now,
                actor=Actor.CLUSTER,
                what=observed.state.value,
                why=_why(record, observed),
                state=observed.state,
                cause=observed.cause,
                epoch=record.epoch,
            )
        )
    return new, transitions


def progress(record: JobRecord, reading: Observation) -> Outcome:
    """The outcome a seen reading gives a record that is not terminal (pure). In order:

    1. an ended incarnation whose compute is still there is ``stopping`` with the cause it ends with;
    2. once the user asked to cancel: ``cancelled`` when it ended and its compute is gone, else
       ``stopping``/``cancelled`` (a stop suspends first: never a false ``held``);
    3. ``cancelled`` means *we* cancelled: one the cluster reports cancelled without the record asking
       for it (someone else stopped it) is ``failed``/``cancelled``, so the policy decides;
    4. the record remembers a cause (:func:`remembered`);
    5. no going back: a state of a lower rank than the record's keeps the record's state, with the
       reading's cause (when it names one) and evidence. ``held`` comes and goes by a person's hold and
       release, except from ``stopping``, which only ends.
    """
    observed = reading.outcome
    if observed.terminal and reading.compute is Compute.PRESENT:
        observed = Outcome(State.STOPPING, observed.cause, observed.evidence)
    if record.cancel_requested:
        ended = observed.terminal
        return Outcome(State.CANCELLED if ended else State.STOPPING, Cause.CANCELLED, observed.evidence)
    if observed.state is State.CANCELLED:
        observed = Outcome(State.FAILED, Cause.CANCELLED, observed.evidence)
    observed = remembered(record.outcome, observed)
    before = record.outcome.state
    pause = State.HELD in (before, observed.state) and before is not State.STOPPING
    if observed.state.rank < before.rank and not pause:
        cause = observed.cause if observed.cause is not Cause.NONE else record.outcome.cause
        return Outcome(before, cause, observed.evidence)
    return observed


def _concluded(record: JobRecord, reading: Absent) -> Outcome:
    """The outcome two absent readings conclude."""
    gone = reading.evidence or (
        Evidence(
            kind="Incarnation",
            name=str(reading.handle.identity),
            reason="Gone",
            message=f"{reading.handle} is no longer on the cluster, nor any of its compute",
            at=reading.at,
        ),
    )
    if record.cancel_requested:
        return Outcome(State.CANCELLED, Cause.CANCELLED, (*record.outcome.evidence, *gone))
    if record.outcome.state is State.STOPPING:
        cause = record.outcome.cause if record.outcome.cause is not Cause.NONE else Cause.UNKNOWN
        who: tuple[Evidence, ...] = ()
        if cause is Cause.CANCELLED:  # stopped, and dispatch never asked: someone else did
            who = (
                Evidence(
                    kind="Record",
                    name=record.job_id,
                    reason="StoppedByOthers",
                    message="dispatch did not ask for this stop: someone else (or the cluster) stopped it",
                    at=reading.at,
                ),
            )
        return Outcome(State.FAILED, cause, (*record.outcome.evidence, *gone, *who))
    return Outcome(State.LOST, Cause.UNKNOWN, gone)


def refines(record: JobRecord, observed: Outcome) -> bool:
    """Whether ``observed`` names the cause of the record's ``failed``/``unknown`` outcome: a failure of
    a typed cause, read before the supervisor decided on the unknown one (its plan is not final)."""
    return (
        (record.outcome.state, record.outcome.cause) == (State.FAILED, Cause.UNKNOWN)
        and observed.state is State.FAILED
        and observed.cause not in (Cause.NONE, Cause.UNKNOWN, Cause.CANCELLED)
        and (record.plan is None or record.plan.action not in (PlanAction.FAIL, PlanAction.HOLD))
        and not record.cancel_requested
    )


DISRUPTIONS = frozenset({Cause.PREEMPTED, Cause.EVICTED, Cause.NODE_LOST})
"""Causes that come from the cluster taking a node away: the job's other nodes are torn down after them."""


def remembered(previous: Outcome, current: Outcome) -> Outcome:
    """``current``, unless ``previous`` — the record's outcome for the same incarnation, not terminal —
    has a cause that ``current`` only follows from:

    - ``current`` is ``failed``/``unknown``: the job failed of the cause already seen;
    - ``previous`` is a disruption (preempted, evicted, node lost) and ``current`` an exit code whose
      every exit is by a signal (128+N: 143 for SIGTERM, 137 for SIGKILL): the other nodes were torn
      down after one was taken away — a program that exits 1 of its own is its own cause.

    Both evidences are kept."""
    if previous.terminal or previous.cause in (Cause.NONE, Cause.UNKNOWN):
        return current
    if (current.state, current.cause) == (State.FAILED, Cause.UNKNOWN) or (
        previous.cause in DISRUPTIONS and current.cause is Cause.EXIT_CODE and _signalled(current)
    ):
        kept = (*previous.evidence, *(e for e in current.evidence if e not in previous.evidence))
        return Outcome(current.state, previous.cause, kept)
    return current


def _signalled(outcome: Outcome) -> bool:
    """Whether every exit code the outcome's evidence names is a death by a signal (128+N)."""
    codes = [e.exit_code for e in outcome.evidence if e.exit_code is not None]
    return bool(codes) and all(code > 128 for code in codes)


def _why(record: JobRecord, outcome: Outcome) -> str:
    """The history line of a new outcome: its evidence, and for a stop, who asked for it."""
    seen = "; ".join(str(e) for e in outcome.evidence)
    if outcome.state is State.STOPPING:
        who = "cancel requested by the user" if record.cancel_requested else "ended on the cluster"
        return f"{who}; its compute is not gone yet" + (f": {seen}" if seen else "")
    return seen
