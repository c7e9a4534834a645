"""What to do next for one job: the pure decisions the supervisor and the facade share.

:func:`dispatch.fold.fold` turns an observation into a record; this module decides, from a record, its
policy and the time, the one action to take next (:func:`next`), and builds every record change the
operator and the supervisor write (:func:`submitted`, :func:`started`, :func:`requeued`, ...). Every
function here is pure: it reads its arguments and returns values, so each decision is tested alone (a
table and property tests in ``tests/host/test_decide.py``) and ``Cluster`` and ``Supervisor`` cannot
disagree about what a transition means.

Retry decisions follow kopf's split: :func:`classify` maps a dispatch error to a
:class:`TemporaryError` (try again later: busy, unavailable, a write whose effect is unknown until an
observation settles it, a record that changed under us) or a :class:`PermanentError` (trying again
cannot help: the request is invalid or unsupported, or the credentials do not allow it).
"""

from __future__ import annotations

from dispatch.errors import (
    BusyError,
    ConflictError,
    DispatchError,
    InvalidError,
    NotFoundError,
    OutcomeUnknownError,
    PermissionDeniedError,
    UnavailableError,
    UnsupportedError,
)
from dispatch.model import (
    EPOCH_BOUND,
    Action,
    Actor,
    Cause,
    Epoch,
    Evidence,
    Handle,
    Identity,
    JobRecord,
    JobSpec,
    Outcome,
    Plan,
    PlanAction,
    Policy,
    State,
    Transition,
)

__all__ = [
    "FINAL_PLANS",
    "STOP_GRACE",
    "STOP_RESEND",
    "PermanentError",
    "Step",
    "TemporaryError",
    "cancel_requested",
    "cancelled_off_cluster",
    "ceased",
    "classify",
    "current_handle",
    "final",
    "forgotten",
    "gave_up",
    "held",
    "leftovers_stopped",
    "next",
    "owned",
    "placed",
    "previous_handle",
    "released",
    "requeued",
    "resubmitted",
    "settled",
    "start_failed",
    "start_refused",
    "start_unknown",
    "started",
    "stop_asked",
    "submitted",
    "write_unknown",
]

Step = tuple[JobRecord, list[Transition]]
"""A record change: the new record and the transitions to append with it (one compare-and-swap)."""

FINAL_PLANS = frozenset({PlanAction.FAIL, PlanAction.HOLD})
"""Plans that, written on a terminal record, mean the supervisor gave up: the outcome is final."""

STOP_GRACE = 60.0
"""Seconds an incarnation that ended on the cluster is given for its compute to go by itself (a pod's
default termination grace is 30 s, Slurm's KillWait 30 s) before the supervisor stops what remains."""

STOP_RESEND = 30.0
"""Seconds between two stops of what remains of an ended incarnation, until it is gone."""


# ---------------------------------------------------------------------------------------- retries


class TemporaryError(DispatchError):
    """Trying again later may succeed (after ``delay`` seconds at the earliest)."""

    def __init__(self, message: str, *, delay: float = 1.0) -> None:
        super().__init__(message)
        self.delay = delay


class PermanentError(DispatchError):
    """Trying again cannot help: the decision must change, not the timing."""


def classify(exc: DispatchError) -> TemporaryError | PermanentError:
    """The retry decision for an error a backend or store raised (the original is the ``__cause__``).

    Temporary: ``BusyError`` (pods still terminating), ``UnavailableError`` (the cluster or store is
    unreachable), ``OutcomeUnknownError`` (observe, then act again: the record says so until then),
    ``ConflictError`` (the record or object changed under us: read again), ``NotFoundError`` (a read
    raced a delete). Permanent: ``InvalidError``, ``UnsupportedError`` (and ``ReadOnlyError``),
    ``PermissionDeniedError``. An error of another class is temporary: giving up is the one decision
    that cannot be undone."""
    if isinstance(exc, TemporaryError | PermanentError):
        return exc
    message = f"{type(exc).__name__}: {exc}"
    result: TemporaryError | PermanentError
    if isinstance(exc, InvalidError | UnsupportedError | PermissionDeniedError):
        result = PermanentError(message)
    elif isinstance(exc, BusyError | OutcomeUnknownError | ConflictError | NotFoundError):
        result = TemporaryError(message, delay=1.0)
    elif isinstance(exc, UnavailableError):
        result = TemporaryError(message, delay=2.0)
    else:
        result = TemporaryError(message, delay=5.0)
    result.__cause__ = exc
    return result


# ---------------------------------------------------------------------------------------- reading


def current_handle(record: JobRecord) -> Handle | None:
    """The handle of the record's current incarnation (epoch ``N``), if it is on the cluster."""
    h = record.handle
    return h if h is not None and h.identity.epoch.n == record.epoch.n else None


def previous_handle(record: JobRecord) -> Handle | None:
    """The handle of an earlier incarnation the record still points at: during a requeue, the one that
    must be stopped and gone before the next one starts."""
    h = record.handle
    return h if h is not None and h.identity.epoch.n != record.epoch.n else None


def owned(record: JobRecord, cluster: str, backend: str) -> bool:
    """Whether a process opened on cluster ``cluster`` with adapter ``backend`` may change the record.

    A record belongs to the cluster of its current incarnation (SPEC §6.1). A record written before
    dispatch recorded clusters (``cluster`` empty) is taken by a process of the adapter its handle names
    (any, when it has none), which then records its own cluster in it."""
    if record.cluster:
        return record.cluster == cluster
    return record.handle is None or record.handle.backend == backend


def _rule_text(cause: Cause, policy: Policy) -> str:
    rule = policy.rule_for(cause)
    where = "rule" if cause in policy.rules else "default rule"
    if rule.action is Action.REQUEUE:
        return (
            f"policy {where} {cause.value}: requeue (max {rule.max}, backoff {rule.backoff:g} s, "
            f"cap {rule.backoff_cap:g} s)"
        )
    return f"policy {where} {cause.value}: {rule.action.value}"


# ---------------------------------------------------------------------------------------- next


def next(record: JobRecord, policy: Policy, now: float) -> Plan:
    """The one action to take next for ``record`` under ``policy`` (the record's own policy, when it
    has one, overrides it) at ``now``. Pure. In order:

    1. terminal: ``DONE`` once succeeded, cancelled (or cancelled by request), or already given up
       (the record's plan is ``FAIL``/``HOLD``); else the rule for its cause: ``FAIL`` (give up, with
       the reason), ``HOLD`` (give up until a person resubmits), or ``REQUEUE`` to ``N+1`` not before
       the rule's backoff — unless the rule's own ``max`` requeues are spent (each rule counts the
       requeues made under it: its budget; its backoff doubles with that count alone), the policy's
       ``maxRequeues`` in all are spent, or the epoch would reach ``EPOCH_BOUND`` (then ``FAIL``,
       saying which);
    2. a write whose effect is unknown: ``SETTLE`` (observe before acting again);
    3. an earlier incarnation still referenced (a requeue in progress): ``CEASE`` (stop it and wait
       until its compute is gone);
    4. cancel requested: ``STOP``; an ended incarnation whose compute remains: its reaping;
    5. queued without capacity longer than the ``no_capacity`` rule's ``after``: ``REQUEUE``;
    6. not on the cluster: ``WAIT`` until the plan's ``not_before``, then ``START``;
    7. else ``WAIT`` for the cluster.
    """
    policy = record.policy if record.policy is not None else policy
    outcome = record.outcome
    plan = record.plan
    if outcome.terminal:
        if plan is not None and plan.action in FINAL_PLANS:
            return Plan(PlanAction.DONE, plan.reason or f"given up ({plan.action.value})")
        if outcome.state in (State.SUCCEEDED, State.CANCELLED) or record.cancel_requested:
            return Plan(PlanAction.DONE, f"{outcome.state.value}")
        cause = outcome.cause
        rule = policy.rule_for(cause)
        text = _rule_text(cause, policy)
        if rule.action is Action.FAIL:
            return Plan(PlanAction.FAIL, text)
        if rule.action is Action.HOLD:
            return Plan(PlanAction.HOLD, f"{text}: waiting for a person (dispatch resubmit)")
        return _requeue(record, policy, cause, text, now) or Plan(PlanAction.FAIL, text)
    if record.unknown_write is not None:
        return Plan(PlanAction.SETTLE, record.unknown_write)
    prev = previous_handle(record)
    if prev is not None:
        return Plan(PlanAction.CEASE, f"{prev.identity} must be gone before {record.epoch} starts")
    if record.cancel_requested:
        return Plan(PlanAction.STOP, "cancel requested")
    if outcome.state is State.STOPPING:
        return _reap(record, now)
    waited = _without_capacity(record, policy, now)
    if waited is not None:
        return waited
    if current_handle(record) is None:
        if record.hold_requested:
            return Plan(PlanAction.WAIT, "held before it was placed")
        not_before = plan.not_before if plan is not None else None
        if not_before is not None and now < not_before:
            # A plan written without a reason (by an older version, or by hand) still says why we wait.
            reason = (plan.reason if plan is not None else "") or "backoff before the next incarnation"
            return Plan(PlanAction.WAIT, reason, not_before=not_before)
        return Plan(PlanAction.START, f"place {record.job_id}@{record.epoch} on the cluster")
    # Queued for capacity under a rule with ``after``: the wait ends by itself then, so it has a time (a
    # supervisor passes a wait without one by until the record moves).
    gives_up_at = _gives_up_at(record, policy)
    return Plan(
        PlanAction.WAIT,
        f"{outcome.state.value}: waiting for the cluster",
        not_before=gives_up_at if gives_up_at is not None and now < gives_up_at else None,
    )


def _queued_since(record: JobRecord) -> float | None:
    """Since when the incarnation has been queued for want of capacity (``None``: it is not)."""
    if record.outcome.state is not State.QUEUED or record.outcome.cause is not Cause.NO_CAPACITY:
        return None
    return record.since if record.since is not None else record.updated_at


def _gives_up_at(record: JobRecord, policy: Policy) -> float | None:
    """When an incarnation queued for want of capacity is given up under its rule's ``after`` (step 5
    of :func:`next`; ``None``: it is not queued so, or the rule has no ``after``)."""
    since = _queued_since(record)
    after = policy.rule_for(Cause.NO_CAPACITY).after
    return None if since is None or after is None else since + after


def _requeue(record: JobRecord, policy: Policy, cause: Cause, text: str, now: float) -> Plan | None:
    """The requeue the rule for ``cause`` allows now, else ``FAIL`` saying which budget is spent;
    ``None`` when the rule does not requeue."""
    rule = policy.rule_for(cause)
    if rule.action is not Action.REQUEUE:
        return None
    name = policy.rule_name(cause)
    attempt = record.requeues_under(name) + 1
    if attempt > rule.max:
        return Plan(PlanAction.FAIL, f"{text}: the {rule.max} requeue(s) allowed under rule {name} are spent")
    if policy.max_requeues is not None and record.epoch.r >= policy.max_requeues:
        return Plan(
            PlanAction.FAIL,
            f"{text}: the policy's {policy.max_requeues} requeue(s) in all (maxRequeues) are spent",
        )
    if record.epoch.n + 1 >= EPOCH_BOUND:
        return Plan(PlanAction.FAIL, f"{text}: epoch {record.epoch} cannot grow to {EPOCH_BOUND}")
    delay = rule.delay(attempt)
    where = ", on another cluster" if rule.elsewhere else ""
    return Plan(
        PlanAction.REQUEUE,
        f"{text}: requeue {attempt} of {rule.max} under rule {name}{where}, after {delay:g} s",
        not_before=now + delay,
        rule=name,
        avoid=record.cluster if rule.elsewhere else "",
    )


def _without_capacity(record: JobRecord, policy: Policy, now: float) -> Plan | None:
    """An incarnation queued for want of capacity longer than its rule's ``after`` is given up on its
    cluster and requeued under the rule (SPEC §15: elsewhere, when the rule says so). Nothing when the
    rule has no ``after``, or its budget is spent: the incarnation then waits where it is."""
    if current_handle(record) is None or record.hold_requested:
        return None
    since = _queued_since(record)
    at = _gives_up_at(record, policy)
    if since is None or at is None or now < at:
        return None
    text = f"{_rule_text(Cause.NO_CAPACITY, policy)}: queued without capacity for {now - since:.0f} s"
    plan = _requeue(record, policy, Cause.NO_CAPACITY, text, now)
    return plan if plan is not None and plan.action is PlanAction.REQUEUE else None


def _reap(record: JobRecord, now: float) -> Plan:
    """The plan for an incarnation that ended on the cluster with compute still there: wait
    :data:`STOP_GRACE` for it to go by itself (pods terminating), then stop it — a terminal record never
    sits over live compute (a job failed for its configuration, whose pods hold quota; a Trainer that
    re-creates the JobSet of a TrainJob someone else is deleting). The stop is sent again every
    :data:`STOP_RESEND` seconds until the compute is gone."""
    ended = (
        f"{record.job_id}@{record.epoch} ended ({record.outcome.cause.value}) and its compute is still there"
    )
    if record.stop_asked is not None:
        again = record.stop_asked + STOP_RESEND
        if now < again:
            return Plan(
                PlanAction.WAIT,
                f"{ended}: stopped at {record.stop_asked:.0f}, waiting for it to go",
                not_before=again,
            )
        return Plan(PlanAction.STOP, f"{ended}: asking again")
    since = record.since if record.since is not None else record.updated_at
    if now < since + STOP_GRACE:
        return Plan(
            PlanAction.WAIT, f"{ended}: waiting {STOP_GRACE:g} s for it to go", not_before=since + STOP_GRACE
        )
    return Plan(PlanAction.STOP, f"{ended} after {STOP_GRACE:g} s: stopping what remains")


def stop_asked(record: JobRecord, plan: Plan, *, now: float) -> Step | None:
    """The supervisor asks the cluster to end what remains of an ended incarnation (see :func:`_reap`):
    recorded before it is sent, said in the history the first time."""
    if record.cancel_requested or record.outcome.state is not State.STOPPING:
        return None
    transitions = (
        [_t(now, Actor.SUPERVISOR, "stopping what remains", why=plan.reason, epoch=record.epoch)]
        if record.stop_asked is None
        else []
    )
    return record.replace(stop_asked=now), transitions


def leftovers_stopped(record: JobRecord, why: str, *, actor: Actor, now: float) -> Step:
    """What a finished record's incarnation still ran on the cluster was stopped (a terminal record never
    sits over live compute): said in the history; the outcome stays the cluster's."""
    return record, [_t(now, actor, "stopped leftovers", why=why, epoch=record.epoch)]


def final(record: JobRecord, policy: Policy, now: float) -> bool:
    """True when nothing more will happen to the record without a person (its outcome is final)."""
    return next(record, policy, now).action is PlanAction.DONE


# ---------------------------------------------------------------------------------------- changes


def _t(
    now: float,
    actor: Actor,
    what: str,
    *,
    why: str = "",
    state: State | None = None,
    cause: Cause | None = None,
    epoch: Epoch | None = None,
    cluster: str = "",
) -> Transition:
    return Transition(
        at=now, actor=actor, what=what, why=why, state=state, cause=cause, epoch=epoch, cluster=cluster
    )


def submitted(
    job_id: str,
    spec: JobSpec,
    *,
    policy: Policy | None,
    held: bool,
    now: float,
    cluster: str = "",
    nonce: str = "",
    clusters: tuple[str, ...] = (),
    placed: str = "",
) -> tuple[JobRecord, Transition]:
    """The first record of a job (epoch ``1.0``, pending, belonging to ``cluster``, with the ``nonce``
    its incarnations' identities carry) and its first transition. In a fleet: ``clusters`` the names of
    the clusters it may go to (empty: any), ``placed`` why the fleet placed it on ``cluster``."""
    epoch = Epoch()
    record = JobRecord(
        job_id=job_id,
        spec=spec,
        created_at=now,
        updated_at=now,
        policy=policy,
        epoch=epoch,
        hold_requested=held,
        cluster=cluster,
        nonce=nonce,
        since=now,
        clusters=clusters,
        plan=Plan(PlanAction.START, placed, placed=cluster) if placed else None,
    )
    why = "; ".join(w for w in ("held" if held else "", placed) if w)
    first = _t(now, Actor.USER, "submitted", why=why, state=State.PENDING, epoch=epoch, cluster=cluster)
    return record, first


def started(record: JobRecord, handle: Handle, *, actor: Actor, now: float) -> Step | None:
    """The record once ``handle`` (of its current incarnation) is on the cluster; ``None`` when there
    is nothing to write (already recorded, or the record moved to another incarnation)."""
    if handle.identity.epoch.n != record.epoch.n or handle.identity.job_id != record.job_id:
        return None
    if record.handle == handle and record.unknown_write is None:
        return None
    new = record.replace(handle=handle, unknown_write=None)
    return new, [_t(now, actor, "started", why=str(handle), epoch=record.epoch, cluster=handle.cluster)]


def write_unknown(record: JobRecord, note: str, what: str, *, actor: Actor, now: float) -> Step:
    """The record saying a write's effect is unknown (``note``), until an observation settles it."""
    return record.replace(unknown_write=note), [_t(now, actor, what, why=note, epoch=record.epoch)]


def start_unknown(record: JobRecord, identity: Identity, reason: str, *, actor: Actor, now: float) -> Step:
    """A start whose effect could not be known."""
    return write_unknown(
        record, f"start of {identity}: {reason}", "start outcome unknown", actor=actor, now=now
    )


def settled(record: JobRecord, why: str, *, now: float) -> Step | None:
    """The unknown write settled by an observation that found nothing to fold (``why`` says what)."""
    if record.unknown_write is None:
        return None
    t = _t(now, Actor.CLUSTER, "settled", why=f"{record.unknown_write}: {why}", epoch=record.epoch)
    return record.replace(unknown_write=None), [t]


def start_refused(record: JobRecord, identity: Identity, exc: DispatchError, *, now: float) -> Step:
    """The cluster refused the start (the spec, as configured): ``failed``/``invalid_spec``."""
    reason = str(exc)
    ev = Evidence(kind="Start", name=str(identity), reason=type(exc).__name__, message=reason)
    refused = Outcome(State.FAILED, Cause.INVALID_SPEC, (ev,))
    t = _t(
        now,
        Actor.CLUSTER,
        "refused",
        why=reason,
        state=State.FAILED,
        cause=Cause.INVALID_SPEC,
        epoch=identity.epoch,
    )
    return record.replace(outcome=refused, unknown_write=None), [t]


def start_failed(record: JobRecord, identity: Identity, reason: str, *, actor: Actor, now: float) -> Step:
    """A start that failed without effect (unreachable, denied...): the record stays pending and says why."""
    return record, [_t(now, actor, "start failed", why=reason, epoch=identity.epoch)]


def forgotten(record: JobRecord, reason: str, *, now: float) -> Step | None:
    """The user ends a record whose cluster is gone: ``lost``/``unknown`` with the user as actor and the
    reason in the history; nothing is asked of any cluster. A terminal record is left as it is."""
    if record.outcome.terminal:
        return None
    ev = Evidence(kind="Record", name=record.job_id, reason="Forgotten", message=reason)
    t = _t(
        now, Actor.USER, "forgotten", why=reason, state=State.LOST, cause=Cause.UNKNOWN, epoch=record.epoch
    )
    lost = Outcome(State.LOST, Cause.UNKNOWN, (ev,))
    # Given up at once: a forgotten job is never requeued, whatever the policy says about its cause.
    plan = Plan(PlanAction.FAIL, f"forgotten: {reason}")
    return record.replace(outcome=lost, unknown_write=None, plan=plan), [t]


def cancel_requested(record: JobRecord, *, now: float) -> Step | None:
    """The user's intent to cancel, recorded before anything is sent: the record is ``stopping`` (cause
    ``cancelled``) from now until a reading finds its compute gone — never a false ``held`` on the way,
    whatever the cluster shows while it stops."""
    if record.outcome.terminal or record.cancel_requested:
        return None
    ev = Evidence(
        kind="Record",
        name=record.job_id,
        reason="CancelRequested",
        message="cancel requested by the user",
        at=now,
    )
    stopping = Outcome(State.STOPPING, Cause.CANCELLED, (ev,))
    t = _t(
        now, Actor.USER, "cancel requested", state=State.STOPPING, cause=Cause.CANCELLED, epoch=record.epoch
    )
    return record.replace(cancel_requested=True, outcome=stopping), [t]


def cancelled_off_cluster(record: JobRecord, *, actor: Actor, now: float) -> Step | None:
    """A cancelled job whose current incarnation is not on the cluster: ``cancelled`` at once."""
    if record.outcome.terminal:
        return None
    t = _t(
        now,
        actor,
        "cancelled",
        why="not on the cluster",
        state=State.CANCELLED,
        cause=Cause.CANCELLED,
        epoch=record.epoch,
    )
    return record.replace(outcome=Outcome(State.CANCELLED, Cause.CANCELLED), unknown_write=None), [t]


def held(record: JobRecord, handle: Handle, token: str, *, now: float) -> Step:
    """The hold on ``handle`` recorded; ``ConflictError`` if the record moved to another incarnation."""
    if record.handle != handle:
        raise ConflictError(f"job {record.job_id!r} moved to another incarnation while being held")
    return record.replace(hold_requested=True, hold_token=token), [
        _t(now, Actor.USER, "hold", epoch=record.epoch)
    ]


def released(record: JobRecord, *, now: float) -> Step:
    """The hold given up."""
    return record.replace(hold_requested=False, hold_token=None), [
        _t(now, Actor.USER, "release", epoch=record.epoch)
    ]


def resubmitted(
    record: JobRecord, spec: JobSpec, epoch: Epoch, *, expected_revision: int, now: float
) -> Step:
    """A finished job made pending again as incarnation ``epoch`` (``N+1.0``) with ``spec``;
    ``ConflictError`` if the record changed since the caller read it at ``expected_revision``."""
    if record.revision != expected_revision:
        raise ConflictError(f"job {record.job_id!r} changed while being resubmitted; retry")
    new = record.replace(
        requeues={},  # each rule's budget counts from the last submit or resubmit
        spec=spec,
        epoch=epoch,
        handle=None,
        outcome=Outcome(State.PENDING),
        hold_token=None,
        hold_requested=False,
        cancel_requested=False,
        unknown_write=None,
        plan=None,
        stop_asked=None,
    )
    return new, [_t(now, Actor.USER, "resubmitted", state=State.PENDING, epoch=epoch)]


def requeued(record: JobRecord, plan: Plan, *, now: float) -> Step:
    """ "Requeue to ``N+1``": the record moves to the next epoch (``N+1.R+1``), pending, still pointing
    at the previous incarnation (which must cease before the next starts), with a ``START`` plan not
    before the backoff. The transition names the policy rule that allowed it."""
    if plan.action is not PlanAction.REQUEUE:
        raise InvalidError(f"expected a requeue plan, got {plan.action.value}", path="plan")
    epoch = record.epoch.requeued()
    verb = "ended" if record.outcome.terminal else "given up"
    ended = f"{record.epoch} {verb} {record.outcome.state.value}/{record.outcome.cause.value}"
    requeues = dict(record.requeues)
    if plan.rule:
        requeues[plan.rule] = record.requeues_under(plan.rule) + 1
    new = record.replace(
        requeues=requeues,
        epoch=epoch,
        outcome=Outcome(State.PENDING),
        hold_token=None,
        hold_requested=False,
        unknown_write=None,
        stop_asked=None,
        plan=Plan(PlanAction.START, plan.reason, not_before=plan.not_before, avoid=plan.avoid),
    )
    t = _t(now, Actor.SUPERVISOR, "requeued", why=f"{ended}; {plan.reason}", state=State.PENDING, epoch=epoch)
    return new, [t]


def placed(record: JobRecord, cluster: str, why: str, *, now: float) -> Step | None:
    """The next incarnation, not yet on a cluster, placed by the fleet on ``cluster`` (its identity; SPEC
    §15), ``why`` saying why it was chosen and the others passed over. When ``cluster`` is another than
    the record's, this is the last write of the record's previous cluster: from now on the processes of
    ``cluster`` change the record (SPEC §6.1) and start the incarnation there."""
    if record.outcome.terminal or record.handle is not None or record.cancel_requested:
        return None
    plan = record.plan
    if plan is not None and plan.placed == cluster and record.cluster == cluster:
        return None
    t = _t(now, Actor.SUPERVISOR, "placed", why=why, epoch=record.epoch, cluster=cluster)
    not_before = plan.not_before if plan is not None else None
    return record.replace(
        cluster=cluster, plan=Plan(PlanAction.START, why, not_before=not_before, placed=cluster)
    ), [t]


def ceased(record: JobRecord, handle: Handle, *, now: float) -> Step | None:
    """The previous incarnation ``handle`` has no compute left: the record lets go of it."""
    if record.handle != handle or previous_handle(record) is None:
        return None
    t = _t(now, Actor.CLUSTER, "ceased", why=f"no compute of {handle.identity} remains", epoch=record.epoch)
    return record.replace(handle=None, unknown_write=None), [t]


def gave_up(record: JobRecord, plan: Plan, *, now: float) -> Step | None:
    """A terminal record made final by a ``FAIL`` or ``HOLD`` plan (the reason goes in the history)."""
    if not record.outcome.terminal or plan.action not in FINAL_PLANS:
        return None
    what = "gave up" if plan.action is PlanAction.FAIL else "held for a person"
    t = _t(now, Actor.SUPERVISOR, what, why=plan.reason, epoch=record.epoch)
    return record.replace(plan=plan), [t]
