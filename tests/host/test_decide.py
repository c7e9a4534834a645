"""The pure decisions: ``decide.next`` as a table and as properties, and the retry split."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch import decide
from dispatch.errors import (
    BusyError,
    ConflictError,
    InvalidError,
    NotFoundError,
    OutcomeUnknownError,
    PermissionDeniedError,
    ReadOnlyError,
    UnavailableError,
    UnsupportedError,
)
from dispatch.model import (
    EPOCH_BOUND,
    Action,
    Cause,
    Epoch,
    Handle,
    Identity,
    JobRecord,
    JobSpec,
    Outcome,
    Plan,
    PlanAction,
    Policy,
    Rule,
    State,
)

NOW = 1_000.0
SPEC = JobSpec(command=("train",))
POLICY = Policy(
    {
        Cause.PREEMPTED: Rule(Action.REQUEUE, max=2, backoff=10.0, backoff_cap=15.0),
        Cause.OUT_OF_MEMORY: Rule(Action.FAIL),
        Cause.EVICTED: Rule(Action.HOLD),
    }
)


def handle(n: int, r: int = 0) -> Handle:
    return Handle("memory", Identity("job-a", Epoch(n, r)), f"job-a-{n}")


def rec(
    state: State = State.RUNNING,
    cause: Cause = Cause.NONE,
    *,
    epoch: Epoch = Epoch(),
    h: Handle | str | None = "current",
    **kw: object,
) -> JobRecord:
    if h == "current":
        h = handle(epoch.n, epoch.r)
    assert not isinstance(h, str)
    return JobRecord(
        job_id="job-a",
        spec=SPEC,
        created_at=0.0,
        updated_at=0.0,
        epoch=epoch,
        handle=h,
        outcome=Outcome(state, cause),
        **kw,  # type: ignore[arg-type]
    )


# The decision table (docs/supervisor.md shows the same rows; tests/host/test_supervise_docs.py checks it).
TABLE: list[tuple[str, JobRecord, PlanAction, float | None]] = [
    ("succeeded", rec(State.SUCCEEDED), PlanAction.DONE, None),
    ("cancelled", rec(State.CANCELLED, Cause.CANCELLED, cancel_requested=True), PlanAction.DONE, None),
    ("failed, rule requeue, 0 of 2 used", rec(State.FAILED, Cause.PREEMPTED), PlanAction.REQUEUE, NOW + 10),
    (
        "failed, rule requeue, 1 of 2 used",
        rec(State.FAILED, Cause.PREEMPTED, epoch=Epoch(2, 1)),
        PlanAction.REQUEUE,
        NOW + 15,  # 20 s doubled, capped at 15
    ),
    (
        "failed, rule requeue, 2 of 2 used",
        rec(State.FAILED, Cause.PREEMPTED, epoch=Epoch(3, 2)),
        PlanAction.FAIL,
        None,
    ),
    ("failed, rule fail", rec(State.FAILED, Cause.OUT_OF_MEMORY), PlanAction.FAIL, None),
    ("failed, rule hold", rec(State.FAILED, Cause.EVICTED), PlanAction.HOLD, None),
    ("failed, no rule (default fail)", rec(State.FAILED, Cause.EXIT_CODE), PlanAction.FAIL, None),
    ("lost (default fail)", rec(State.LOST, Cause.UNKNOWN), PlanAction.FAIL, None),
    (
        "failed, already given up",
        rec(State.FAILED, Cause.OUT_OF_MEMORY, plan=Plan(PlanAction.FAIL, "policy")),
        PlanAction.DONE,
        None,
    ),
    (
        "start outcome unknown",
        rec(State.PENDING, h=None, unknown_write="start of job-a@1.0: lost"),
        PlanAction.SETTLE,
        None,
    ),
    (
        "requeued, previous not yet gone",
        rec(State.PENDING, epoch=Epoch(2, 1), h=handle(1)),
        PlanAction.CEASE,
        None,
    ),
    (
        "requeued, previous gone, in backoff",
        rec(State.PENDING, epoch=Epoch(2, 1), h=None, plan=Plan(PlanAction.START, "r", not_before=NOW + 5)),
        PlanAction.WAIT,
        NOW + 5,
    ),
    (
        "requeued, previous gone, backoff over",
        rec(State.PENDING, epoch=Epoch(2, 1), h=None, plan=Plan(PlanAction.START, "r", not_before=NOW)),
        PlanAction.START,
        None,
    ),
    ("pending, never placed", rec(State.PENDING, h=None), PlanAction.START, None),
    ("running, cancel requested", rec(State.RUNNING, cancel_requested=True), PlanAction.STOP, None),
    ("pending, cancel requested", rec(State.PENDING, h=None, cancel_requested=True), PlanAction.STOP, None),
    ("running", rec(State.RUNNING), PlanAction.WAIT, None),
    ("queued", rec(State.QUEUED, Cause.NO_CAPACITY), PlanAction.WAIT, None),
    (
        "stopping (ended on the cluster), within the stop grace",
        rec(State.STOPPING, Cause.CONFIG_ERROR, since=NOW - 10),
        PlanAction.WAIT,
        NOW - 10 + decide.STOP_GRACE,
    ),
    (
        "stopping, past the stop grace",
        rec(State.STOPPING, Cause.CONFIG_ERROR, since=NOW - decide.STOP_GRACE),
        PlanAction.STOP,
        None,
    ),
    (
        "stopping, what remains stopped a moment ago",
        rec(State.STOPPING, Cause.CONFIG_ERROR, since=NOW - 100, stop_asked=NOW - 1),
        PlanAction.WAIT,
        NOW - 1 + decide.STOP_RESEND,
    ),
    (
        "stopping, cancel requested",
        rec(State.STOPPING, Cause.CANCELLED, cancel_requested=True),
        PlanAction.STOP,
        None,
    ),
]


@pytest.mark.parametrize(("case", "record", "action", "not_before"), TABLE, ids=[t[0] for t in TABLE])
def test_next_decides_as_the_table_says(
    case: str, record: JobRecord, action: PlanAction, not_before: float | None
) -> None:
    plan = decide.next(record, POLICY, NOW)
    assert plan.action is action, plan
    assert plan.not_before == not_before
    assert plan.reason  # every decision says why


def test_a_requeue_names_the_rule_that_allowed_it() -> None:
    plan = decide.next(rec(State.FAILED, Cause.PREEMPTED), POLICY, NOW)
    assert "rule preempted: requeue (max 2, backoff 10 s" in plan.reason
    assert "requeue 1 of 2" in plan.reason


def test_the_records_own_policy_overrides_the_clusters() -> None:
    own = Policy({Cause.OUT_OF_MEMORY: Rule(Action.REQUEUE, max=1, backoff=0)})
    plan = decide.next(rec(State.FAILED, Cause.OUT_OF_MEMORY, policy=own), POLICY, NOW)
    assert plan.action is PlanAction.REQUEUE


def test_a_requeue_that_would_reach_the_epoch_bound_gives_up() -> None:
    policy = Policy({Cause.PREEMPTED: Rule(Action.REQUEUE, max=EPOCH_BOUND - 1, backoff=0)})
    last = Epoch(EPOCH_BOUND - 1, 5)
    plan = decide.next(rec(State.FAILED, Cause.PREEMPTED, epoch=last), policy, NOW)
    assert plan.action is PlanAction.FAIL
    assert "cannot grow" in plan.reason


def test_requeued_moves_to_the_next_epoch_and_keeps_the_previous_handle() -> None:
    before = rec(State.FAILED, Cause.PREEMPTED)
    plan = decide.next(before, POLICY, NOW)
    new, ts = decide.requeued(before, plan, now=NOW)
    assert new.epoch == Epoch(2, 1)
    assert new.state is State.PENDING
    assert new.handle == before.handle  # the previous incarnation, to retire
    assert new.plan == Plan(PlanAction.START, plan.reason, not_before=NOW + 10)
    assert [t.what for t in ts] == ["requeued"]
    assert "1.0 ended failed/preempted" in ts[0].why and "rule preempted" in ts[0].why
    assert decide.next(new, POLICY, NOW).action is PlanAction.CEASE
    ceased = decide.ceased(new, before.handle, now=NOW)  # type: ignore[arg-type]
    assert ceased is not None
    assert decide.next(ceased[0], POLICY, NOW).action is PlanAction.WAIT
    assert decide.next(ceased[0], POLICY, NOW + 10).action is PlanAction.START


def test_requeued_refuses_another_plan() -> None:
    with pytest.raises(InvalidError):
        decide.requeued(rec(State.FAILED, Cause.PREEMPTED), Plan(PlanAction.FAIL), now=NOW)


def test_gave_up_makes_the_record_final() -> None:
    r = rec(State.FAILED, Cause.OUT_OF_MEMORY)
    plan = decide.next(r, POLICY, NOW)
    assert not decide.final(r, POLICY, NOW)
    step = decide.gave_up(r, plan, now=NOW)
    assert step is not None
    assert decide.final(step[0], POLICY, NOW)
    assert step[1][0].what == "gave up" and "out_of_memory: fail" in step[1][0].why


@pytest.mark.parametrize(
    ("exc", "temporary"),
    [
        (BusyError("pods remain"), True),
        (UnavailableError("down"), True),
        (OutcomeUnknownError("lost"), True),
        (ConflictError("moved"), True),
        (NotFoundError("gone"), True),
        (InvalidError("bad"), False),
        (UnsupportedError("no"), False),
        (ReadOnlyError("ro"), False),
        (PermissionDeniedError("denied"), False),
    ],
)
def test_classify_splits_temporary_from_permanent(exc: Exception, temporary: bool) -> None:
    verdict = decide.classify(exc)  # type: ignore[arg-type]
    assert isinstance(verdict, decide.TemporaryError if temporary else decide.PermanentError)
    assert verdict.__cause__ is exc


# ---------------------------------------------------------------------------------------- properties

states = st.sampled_from(list(State))
causes = st.sampled_from(list(Cause))
rules = st.one_of(
    st.builds(Rule, st.just(Action.FAIL)),
    st.builds(Rule, st.just(Action.HOLD)),
    st.builds(
        Rule,
        st.just(Action.REQUEUE),
        max=st.integers(0, 5),
        backoff=st.floats(0, 100),
        backoff_cap=st.just(100.0),
    ),
)
policies = st.builds(Policy, st.dictionaries(causes, rules, max_size=4), rules)


@st.composite
def records(draw: st.DrawFn) -> JobRecord:
    n = draw(st.integers(1, 6))
    r = draw(st.integers(0, n - 1))
    epoch = Epoch(n, r)
    h = draw(st.sampled_from(["current", "previous", "none"]))
    hd = handle(n, r) if h == "current" else handle(n - 1) if h == "previous" and n > 1 else None
    plan = draw(
        st.none()
        | st.builds(
            Plan, st.sampled_from(list(PlanAction)), st.text(max_size=3), st.none() | st.floats(0, 2000)
        )
    )
    return rec(
        draw(states),
        draw(causes),
        epoch=epoch,
        h=hd,
        plan=plan,
        cancel_requested=draw(st.booleans()),
        unknown_write=draw(st.none() | st.just("start of job-a: lost")),
        policy=draw(st.none() | policies),
    )


@given(records(), policies, st.floats(0, 3000))
def test_next_is_total_and_keeps_the_policys_limits(record: JobRecord, policy: Policy, now: float) -> None:
    plan = decide.next(record, policy, now)
    effective = record.policy if record.policy is not None else policy
    assert plan.reason
    if record.outcome.terminal:
        assert plan.action in (PlanAction.DONE, PlanAction.FAIL, PlanAction.HOLD, PlanAction.REQUEUE)
    else:
        assert plan.action not in (PlanAction.DONE, PlanAction.FAIL, PlanAction.HOLD, PlanAction.REQUEUE)
    if plan.action is PlanAction.REQUEUE:
        rule = effective.rule_for(record.outcome.cause)
        assert rule.action is Action.REQUEUE
        assert record.epoch.r < rule.max
        assert record.outcome.state in (State.FAILED, State.LOST)
        assert not record.cancel_requested
        assert plan.not_before == now + rule.delay(record.epoch.r + 1)
        new, _ = decide.requeued(record, plan, now=now)
        assert new.epoch.n == record.epoch.n + 1 and new.epoch.r == record.epoch.r + 1
    if plan.action is PlanAction.START:
        assert decide.current_handle(record) is None and decide.previous_handle(record) is None
        assert record.plan is None or record.plan.not_before is None or record.plan.not_before <= now
    if plan.action is PlanAction.WAIT and plan.not_before is not None:
        assert plan.not_before > now


@given(records(), policies, st.floats(0, 3000))
def test_next_is_pure(record: JobRecord, policy: Policy, now: float) -> None:
    assert decide.next(record, policy, now) == decide.next(record, policy, now)


def test_waiting_on_a_plan_without_a_reason_still_says_why() -> None:
    # Found by hypothesis: a stored WAIT plan with no reason was returned as it was, reason ''.
    record = rec(State.PENDING, h=None, plan=Plan(PlanAction.WAIT, "", not_before=NOW + 5))
    plan = decide.next(record, POLICY, NOW)
    assert plan.action is PlanAction.WAIT and plan.not_before == NOW + 5
    assert plan.reason


# ---------------------------------------------------------------------------------------- a fleet

FLEET = Policy(
    {
        Cause.PREEMPTED: Rule(Action.REQUEUE, max=2, backoff=10.0, elsewhere=True),
        Cause.NO_CAPACITY: Rule(Action.REQUEUE, max=1, backoff=0.0, elsewhere=True, after=300.0),
    }
)


def test_a_requeue_elsewhere_avoids_the_cluster_it_leaves_until_the_next_start() -> None:
    ended = rec(State.FAILED, Cause.PREEMPTED, cluster="memory:a")
    plan = decide.next(ended, FLEET, NOW)
    assert (plan.action, plan.avoid) == (PlanAction.REQUEUE, "memory:a")
    assert "on another cluster" in plan.reason
    requeued, _ = decide.requeued(ended, plan, now=NOW)
    assert requeued.plan is not None and requeued.plan.avoid == "memory:a"  # the start that follows


def test_waiting_for_capacity_longer_than_the_rule_allows_gives_the_incarnation_up() -> None:
    waiting = rec(State.QUEUED, Cause.NO_CAPACITY, cluster="memory:a", since=NOW - 299.0)
    wait = decide.next(waiting, FLEET, NOW)
    # The wait ends by itself, so it has a time: a supervisor passes a wait without one by until the
    # record moves, and a fleet member would never have given this one up.
    assert (wait.action, wait.not_before) == (PlanAction.WAIT, NOW + 1.0)
    late = waiting.replace(since=NOW - 301.0)
    plan = decide.next(late, FLEET, NOW)
    assert (plan.action, plan.avoid) == (PlanAction.REQUEUE, "memory:a")
    new, transitions = decide.requeued(late, plan, now=NOW)
    assert new.epoch == Epoch(2, 1) and decide.previous_handle(new) == late.handle  # ceased before placed
    assert "given up queued/no_capacity" in transitions[0].why
    # Its budget spent, it waits where it is: giving up on a live incarnation is no failure.
    spent = late.replace(requeues={"no_capacity": 1})
    assert decide.next(spent, FLEET, NOW).action is PlanAction.WAIT
    # Without `after`, no_capacity waits for ever (the rule applies only to an incarnation that ended).
    forever = decide.next(late, POLICY, NOW)
    assert (forever.action, forever.not_before) == (PlanAction.WAIT, None)


def test_placing_hands_the_record_to_its_cluster_once() -> None:
    pending = rec(State.PENDING, epoch=Epoch(2, 1), h=None, cluster="memory:a")
    new, transitions = decide.placed(pending, "memory:b", "placed on b: the first that takes it", now=NOW)
    assert new.cluster == "memory:b" and new.plan is not None and new.plan.placed == "memory:b"
    assert [(t.what, t.why) for t in transitions] == [("placed", "placed on b: the first that takes it")]
    assert decide.placed(new, "memory:b", "again", now=NOW) is None  # placed: nothing to write
    assert decide.next(new, FLEET, NOW).action is PlanAction.START
    on_cluster = rec(State.RUNNING, cluster="memory:a")
    assert decide.placed(on_cluster, "memory:b", "no", now=NOW) is None  # never a live incarnation


@pytest.mark.parametrize(
    ("fields", "path"),
    [
        ({"action": Action.FAIL, "elsewhere": True}, "elsewhere"),
        ({"action": Action.FAIL, "after": 30.0}, "after"),
        ({"action": Action.REQUEUE, "after": 0}, "after"),
        ({"action": Action.REQUEUE, "after": "soon"}, "after"),
        ({"action": Action.REQUEUE, "elsewhere": "yes"}, "elsewhere"),
    ],
)
def test_a_rule_refuses_what_only_a_requeue_takes_or_a_bad_wait(fields: dict[str, object], path: str) -> None:
    with pytest.raises(InvalidError) as err:
        Rule(**fields)  # type: ignore[arg-type]
    assert err.value.path == path
