"""Folding what the cluster reports into a job record: the pure function :func:`fold`.

The facade (``Cluster.get``/``list``/``watch``) and the supervisor both fold observations into records
through this one function, so that every path agrees on what an observation means for a record.
"""

from __future__ import annotations

from dispatch.model import Actor, Cause, JobRecord, Observation, Outcome, State, Transition

__all__ = ["fold", "matches", "remembered"]


def matches(record: JobRecord, observation: Observation) -> bool:
    """True when ``observation`` is of the record's *current* incarnation (same job id, same ``N``).

    Observations of older incarnations (a requeued or resubmitted job's previous object, still
    terminating) and of other jobs say nothing about the record's present, so they are not folded.
    """
    ident = observation.handle.identity
    return ident.job_id == record.job_id and ident.epoch.n == record.epoch.n


def fold(
    record: JobRecord, observation: Observation, *, now: float, lost_confirmed: bool = True
) -> tuple[JobRecord, list[Transition]]:
    """Fold one observation into a record; return the new record and the transitions to append.

    Rules:
    - an observation of another job or another incarnation than the record's current epoch is ignored;
    - a terminal record stays as it is (its outcome is final; a later incarnation needs a resubmit or a
      requeue);
    - when the user asked to cancel and the cluster reports the incarnation ended (any terminal state,
      including ``lost``: the object we deleted is gone), the outcome is ``cancelled``/``cancelled``,
      keeping the cluster's evidence;
    - ``cancelled`` means *we* cancelled: an incarnation the cluster reports cancelled without the record
      asking for it (someone else stopped it) is ``failed``/``cancelled``, so the policy decides;
    - a ``lost`` observation that is not confirmed (``lost_confirmed=False``: one reading, not a second
      one or a watch's deletion) is ignored: an object missing from one read is not yet gone;
    - an observation of the current incarnation settles a write whose outcome was unknown
      (``unknown_write`` is cleared) and gives a record without a handle the observed one;
    - **the record remembers a cause** (what a long-running process saw is kept in the record, so a
      fresh one reads the same outcome): a ``failed``/``unknown`` observation of an incarnation whose
      record, not yet terminal, already shows a cause (``running``/``out_of_memory`` while a container
      restarted in place, say) is ``failed`` of that cause, with both evidences — the cluster deletes a
      failed job's pods, so what was seen before is the best evidence left (:func:`remembered`);
    - nothing changed → the record is returned as it is, with no transition; new evidence for the same
      state and cause updates the record without a transition (the history records what changed, not
      every re-reading of it).

    Transitions are by actor ``cluster`` and carry the new state, cause and epoch.
    """
    if not matches(record, observation) or record.outcome.terminal:
        return record, []
    observed = observation.outcome
    if record.cancel_requested and observed.terminal:
        observed = Outcome(State.CANCELLED, Cause.CANCELLED, observed.evidence)
    elif observed.state is State.CANCELLED:
        observed = Outcome(State.FAILED, Cause.CANCELLED, observed.evidence)
    elif observed.state is State.LOST and not lost_confirmed:
        return record, []
    else:
        observed = remembered(record.outcome, observed)
    handle = record.handle
    if handle is None or handle.identity.epoch.n != record.epoch.n:
        handle = observation.handle
    if observed == record.outcome and handle == record.handle and record.unknown_write is None:
        return record, []
    new = record.replace(outcome=observed, handle=handle, unknown_write=None, updated_at=now)
    transitions: list[Transition] = []
    if record.unknown_write is not None:
        transitions.append(
            Transition(
                at=now,
                actor=Actor.CLUSTER,
                what="settled",
                why=f"observed {observation.handle}: {record.unknown_write}",
                epoch=record.epoch,
            )
        )
    if (observed.state, observed.cause) != (record.outcome.state, record.outcome.cause):
        transitions.append(
            Transition(
                at=now,
                actor=Actor.CLUSTER,
                what=observed.state.value,
                why=_why(observed),
                state=observed.state,
                cause=observed.cause,
                epoch=record.epoch,
            )
        )
    return new, transitions


def remembered(previous: Outcome, current: Outcome) -> Outcome:
    """``current``, unless it is ``failed``/``unknown`` and ``previous`` — the record's outcome for the
    same incarnation, not terminal — has a cause: then the job failed of that cause, with both
    evidences."""
    if (
        previous.terminal
        or previous.cause in (Cause.NONE, Cause.UNKNOWN)
        or (current.state, current.cause) != (State.FAILED, Cause.UNKNOWN)
    ):
        return current
    return Outcome(State.FAILED, previous.cause, (*previous.evidence, *current.evidence))


def _why(outcome: Outcome) -> str:
    """The evidence of an outcome as one line, for the history."""
    return "; ".join(str(e) for e in outcome.evidence)
