"""The pure fold of observations into records: a table of cases, then properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch import (
    Absent,
    Actor,
    Cause,
    Compute,
    Epoch,
    Evidence,
    Handle,
    Identity,
    Image,
    JobRecord,
    JobSpec,
    Observation,
    Outcome,
    State,
)
from dispatch.fold import fold, matches

T0 = 1_000.0
NOW = 2_000.0
SPEC = JobSpec(command=("python", "train.py"), extensions=[Image("img:1")])


def handle(job_id: str = "job-a", epoch: Epoch = Epoch()) -> Handle:
    ident = Identity(job_id, epoch)
    return Handle("memory", ident, f"ns/{ident}")


def record(**changes: object) -> JobRecord:
    base = JobRecord(job_id="job-a", spec=SPEC, created_at=T0, updated_at=T0, handle=handle(), revision=3)
    return base.replace(**changes)


def obs(
    state: State,
    cause: Cause = Cause.NONE,
    h: Handle | None = None,
    reason: str = "",
    compute: Compute = Compute.UNKNOWN,
) -> Observation:
    evidence = (Evidence("Pod", "job-a-0", reason=reason),) if reason else ()
    return Observation(h or handle(), Outcome(state, cause, evidence), at=NOW - 1, compute=compute)


def test_running_observation_moves_a_pending_record_and_says_so() -> None:
    new, ts = fold(record(), obs(State.RUNNING), now=NOW)
    assert new.state is State.RUNNING
    assert new.updated_at == NOW
    assert len(ts) == 1
    t = ts[0]
    assert (t.actor, t.what, t.state, t.cause, t.epoch, t.at) == (
        Actor.CLUSTER,
        "running",
        State.RUNNING,
        Cause.NONE,
        Epoch(),
        NOW,
    )


def test_failure_carries_cause_and_evidence_into_the_transition() -> None:
    new, ts = fold(record(), obs(State.FAILED, Cause.PREEMPTED, reason="PreemptionByScheduler"), now=NOW)
    assert new.outcome.cause is Cause.PREEMPTED
    assert new.outcome.evidence[0].reason == "PreemptionByScheduler"
    assert ts[0].cause is Cause.PREEMPTED
    assert "PreemptionByScheduler" in ts[0].why


@pytest.mark.parametrize(
    ("rec", "observation", "why"),
    [
        (record(), obs(State.RUNNING, h=handle("job-b")), "another job"),
        (record(epoch=Epoch(2, 1)), obs(State.FAILED, Cause.PREEMPTED), "an older incarnation"),
        (
            record(outcome=Outcome(State.SUCCEEDED)),
            obs(State.FAILED, Cause.EXIT_CODE),
            "a terminal record stays terminal",
        ),
        (record(outcome=Outcome(State.RUNNING)), obs(State.RUNNING), "nothing changed"),
        (
            record(outcome=Outcome(State.CANCELLED, Cause.CANCELLED), cancel_requested=True),
            obs(State.LOST, Cause.UNKNOWN),
            "already cancelled",
        ),
    ],
)
def test_observations_that_change_nothing(rec: JobRecord, observation: Observation, why: str) -> None:
    new, ts = fold(rec, observation, now=NOW)
    assert new is rec, why
    assert ts == [], why


def test_a_newer_requeue_count_of_the_same_incarnation_is_folded() -> None:
    # Same N, the identity is the same incarnation even if R differs in the handle.
    rec = record(epoch=Epoch(2, 1), handle=handle(epoch=Epoch(2, 1)))
    new, ts = fold(rec, obs(State.RUNNING, h=handle(epoch=Epoch(2, 0))), now=NOW)
    assert new.state is State.RUNNING and ts


@pytest.mark.parametrize("ended", [State.FAILED, State.LOST, State.CANCELLED, State.SUCCEEDED])
def test_a_cancel_requested_by_the_user_ends_cancelled(ended: State) -> None:
    rec = record(outcome=Outcome(State.RUNNING), cancel_requested=True)
    new, ts = fold(rec, obs(ended, Cause.UNKNOWN, reason="Deleted"), now=NOW)
    assert (new.state, new.outcome.cause) == (State.CANCELLED, Cause.CANCELLED)
    assert new.outcome.evidence[0].reason == "Deleted"
    assert (ts[0].state, ts[0].cause) == (State.CANCELLED, Cause.CANCELLED)


@pytest.mark.parametrize("seen", [State.RUNNING, State.HELD, State.QUEUED])
def test_a_cancel_requested_is_stopping_while_the_cluster_still_runs_it(seen: State) -> None:
    """A stop suspends first: whatever the cluster shows meanwhile (``held`` included), the record says
    ``stopping``, with the cause it will end with."""
    rec = record(outcome=Outcome(State.RUNNING), cancel_requested=True)
    new, ts = fold(rec, obs(seen, compute=Compute.PRESENT), now=NOW)
    assert (new.state, new.outcome.cause) == (State.STOPPING, Cause.CANCELLED)
    assert "cancel requested by the user" in ts[-1].why


def test_cancelled_only_once_the_compute_is_gone() -> None:
    rec = record(outcome=Outcome(State.STOPPING, Cause.CANCELLED), cancel_requested=True)
    lingering, _ = fold(rec, obs(State.CANCELLED, Cause.CANCELLED, compute=Compute.PRESENT), now=NOW)
    assert lingering.state is State.STOPPING
    gone, ts = fold(lingering, obs(State.CANCELLED, Cause.CANCELLED, compute=Compute.GONE), now=NOW)
    assert (gone.state, gone.outcome.cause) == (State.CANCELLED, Cause.CANCELLED)
    assert [t.state for t in ts] == [State.CANCELLED]


def test_an_ended_incarnation_with_compute_left_is_stopping_with_its_cause() -> None:
    rec = record(outcome=Outcome(State.RUNNING))
    new, ts = fold(
        rec, obs(State.FAILED, Cause.PREEMPTED, reason="Preempted", compute=Compute.PRESENT), now=NOW
    )
    assert (new.state, new.outcome.cause) == (State.STOPPING, Cause.PREEMPTED)
    assert "ended on the cluster; its compute is not gone yet" in ts[-1].why
    done, _ = fold(new, obs(State.FAILED, Cause.PREEMPTED, compute=Compute.GONE), now=NOW)
    assert (done.state, done.outcome.cause) == (State.FAILED, Cause.PREEMPTED)


@pytest.mark.parametrize(
    ("before", "seen", "cause", "after"),
    [
        (State.RUNNING, State.STARTING, Cause.OUT_OF_MEMORY, (State.RUNNING, Cause.OUT_OF_MEMORY)),
        (State.RUNNING, State.QUEUED, Cause.PREEMPTED, (State.RUNNING, Cause.PREEMPTED)),
        (State.STARTING, State.QUEUED, Cause.NONE, (State.STARTING, Cause.NONE)),
        (State.STOPPING, State.RUNNING, Cause.NONE, (State.STOPPING, Cause.PREEMPTED)),
        (State.STOPPING, State.HELD, Cause.NONE, (State.STOPPING, Cause.PREEMPTED)),
        (State.RUNNING, State.HELD, Cause.NONE, (State.HELD, Cause.NONE)),
        (State.HELD, State.QUEUED, Cause.NONE, (State.QUEUED, Cause.NONE)),
    ],
)
def test_no_going_back_within_an_incarnation(
    before: State, seen: State, cause: Cause, after: tuple[State, Cause]
) -> None:
    """The real controllers show a failing job ``starting`` for a moment; a restart in place stays
    ``running`` with the restart in the evidence; only a person's hold and release move ``held``."""
    prior = Cause.PREEMPTED if before is State.STOPPING else Cause.NONE
    rec = record(outcome=Outcome(before, prior))
    new, _ = fold(rec, obs(seen, cause, reason="Seen"), now=NOW)
    assert (new.state, new.outcome.cause) == after
    assert new.outcome.evidence[0].reason == "Seen"


def test_one_absent_reading_changes_nothing_two_conclude_lost() -> None:
    rec = record(outcome=Outcome(State.RUNNING))
    gone = Absent(handle(), at=NOW - 1)
    assert fold(rec, gone, now=NOW) == (rec, [])
    new, ts = fold(rec, gone, now=NOW, confirmed=True)
    assert (new.state, new.outcome.cause) == (State.LOST, Cause.UNKNOWN)
    assert [t.state for t in ts] == [State.LOST]


@pytest.mark.parametrize(
    ("cancel", "before", "after"),
    [
        (True, Outcome(State.STOPPING, Cause.CANCELLED), (State.CANCELLED, Cause.CANCELLED)),
        (False, Outcome(State.STOPPING, Cause.CANCELLED), (State.FAILED, Cause.CANCELLED)),
        (False, Outcome(State.STOPPING, Cause.OUT_OF_MEMORY), (State.FAILED, Cause.OUT_OF_MEMORY)),
    ],
)
def test_an_absent_stopping_incarnation_ends_with_its_cause(
    cancel: bool, before: Outcome, after: tuple[State, Cause]
) -> None:
    rec = record(outcome=before, cancel_requested=cancel)
    new, _ = fold(rec, Absent(handle(), at=NOW - 1), now=NOW, confirmed=True)
    assert (new.state, new.outcome.cause) == after


def test_an_object_of_another_record_of_the_same_job_id_is_not_this_records() -> None:
    rec = record(nonce="aaaa")
    other = Handle("memory", Identity("job-a", Epoch(), "bbbb"), "ns/other")
    assert not matches(rec, obs(State.SUCCEEDED, h=other))
    assert fold(rec, obs(State.SUCCEEDED, h=other), now=NOW) == (rec, [])
    assert fold(rec, Absent(other, at=NOW), now=NOW, confirmed=True) == (rec, [])


def test_an_observation_settles_an_unknown_start_and_adopts_the_handle() -> None:
    rec = record(handle=None, unknown_write="start of job-a@1.0: response lost")
    new, ts = fold(rec, obs(State.QUEUED), now=NOW)
    assert new.handle == handle()
    assert new.unknown_write is None
    # Every placed incarnation has its "started" line, whoever read it first.
    assert [t.what for t in ts] == ["started", "settled", "queued"]


def test_new_evidence_for_the_same_state_updates_without_a_transition() -> None:
    rec = record(
        outcome=Outcome(State.STARTING, Cause.IMAGE_PULL, (Evidence("Pod", "p", reason="ErrImagePull"),))
    )
    new, ts = fold(rec, obs(State.STARTING, Cause.IMAGE_PULL, reason="ImagePullBackOff"), now=NOW)
    assert new.outcome.evidence[0].reason == "ImagePullBackOff"
    assert ts == []


def test_matches_compares_job_id_and_incarnation() -> None:
    rec = record(epoch=Epoch(3, 0))
    assert matches(rec, obs(State.RUNNING, h=handle(epoch=Epoch(3, 2))))
    assert not matches(rec, obs(State.RUNNING, h=handle(epoch=Epoch(2, 0))))
    assert not matches(rec, obs(State.RUNNING, h=handle("job-b", Epoch(3, 0))))


# ---------------------------------------------------------------------------- properties

states = st.sampled_from(list(State))
causes = st.sampled_from(list(Cause))
epochs = st.builds(lambda n, r: Epoch(n, min(r, n - 1)), st.integers(1, 4), st.integers(0, 3))
evidence = st.lists(
    st.builds(Evidence, kind=st.sampled_from(["Pod", "TrainJob"]), name=st.text("abc", max_size=3)),
    max_size=2,
).map(tuple)
outcomes = st.builds(Outcome, states, causes, evidence)
records = st.builds(
    lambda ep, out, cancel, unknown, has_handle: record(
        epoch=ep,
        handle=handle(epoch=ep) if has_handle else None,
        outcome=out,
        cancel_requested=cancel,
        unknown_write="start: lost" if unknown else None,
    ),
    epochs,
    outcomes,
    st.booleans(),
    st.booleans(),
    st.booleans(),
)
observations = st.builds(
    lambda job, ep, out: Observation(handle(job, ep), out, at=NOW),
    st.sampled_from(["job-a", "job-b"]),
    epochs,
    outcomes,
)


@given(records, observations)
def test_folding_twice_is_folding_once(rec: JobRecord, observation: Observation) -> None:
    once, _ = fold(rec, observation, now=NOW)
    twice, ts = fold(once, observation, now=NOW + 1)
    assert twice is once
    assert ts == []


@given(records, st.lists(observations, max_size=6))
def test_a_terminal_record_never_leaves_its_state(rec: JobRecord, seq: list[Observation]) -> None:
    current = rec
    terminal_at: Outcome | None = rec.outcome if rec.outcome.terminal else None
    for observation in seq:
        current, _ = fold(current, observation, now=NOW)
        if terminal_at is not None:
            assert current.outcome == terminal_at
        elif current.outcome.terminal:
            terminal_at = current.outcome


@given(records, observations)
def test_transitions_are_by_the_cluster_and_describe_the_new_record(
    rec: JobRecord, observation: Observation
) -> None:
    new, ts = fold(rec, observation, now=NOW)
    for t in ts:
        assert t.actor is Actor.CLUSTER
        assert t.epoch == rec.epoch
    state_changes = [t for t in ts if t.state is not None]
    if (new.state, new.outcome.cause) != (rec.state, rec.outcome.cause):
        assert [(t.state, t.cause) for t in state_changes] == [(new.state, new.outcome.cause)]
    else:
        assert state_changes == []
    assert new.job_id == rec.job_id and new.epoch == rec.epoch and new.spec == rec.spec


computes = st.sampled_from(list(Compute))
readings = st.builds(
    lambda out, compute: Observation(handle(), out, at=NOW, compute=compute), outcomes, computes
)


@given(st.lists(readings, max_size=8))
def test_a_record_never_goes_back_and_ends_only_once_its_compute_is_gone(seq: list[Observation]) -> None:
    """Over any sequence of readings of one incarnation: the state's rank never falls (``held`` aside,
    and never out of ``stopping``), and a record becomes terminal only from a reading whose compute is
    not present."""
    current = record(outcome=Outcome(State.PENDING))
    for reading in seq:
        new, _ = fold(current, reading, now=NOW)
        before, after = current.state, new.state
        if not (State.HELD in (before, after) and before is not State.STOPPING) and not before.terminal:
            assert after.rank >= before.rank, f"{before} went back to {after} on {reading.outcome}"
        if after.terminal and not before.terminal:
            assert reading.compute is not Compute.PRESENT, f"{after} over live compute"
        current = new


@given(records, observations)
def test_a_cancelled_by_user_record_that_ends_ends_cancelled(
    rec: JobRecord, observation: Observation
) -> None:
    new, _ = fold(rec, observation, now=NOW)
    if rec.cancel_requested and not rec.outcome.terminal and new.outcome.terminal:
        assert (new.state, new.outcome.cause) == (State.CANCELLED, Cause.CANCELLED)


def _exited(code: int, state: State = State.FAILED) -> Observation:
    ev = Evidence("Pod", "job-a-1", reason="Error", exit_code=code)
    return Observation(handle(), Outcome(state, Cause.EXIT_CODE, (ev,)), at=NOW - 1, compute=Compute.GONE)


@pytest.mark.parametrize("disruption", [Cause.PREEMPTED, Cause.EVICTED, Cause.NODE_LOST])
def test_nodes_torn_down_after_a_disruption_keep_its_cause(disruption: Cause) -> None:
    """One node preempted; the other ranks die of the SIGTERM that follows (143) and the job fails: it
    failed of the preemption, whichever reading came last (the preempted pod may be gone by then)."""
    seen = record(
        outcome=Outcome(State.RUNNING, disruption, (Evidence("Pod", "job-a-0", reason="Preempted"),))
    )
    running, _ = fold(seen, _exited(143, State.RUNNING), now=NOW)
    assert (running.state, running.outcome.cause) == (State.RUNNING, disruption)
    again, _ = fold(running, _exited(143, State.RUNNING), now=NOW + 1)
    assert again is running  # the same reading again adds nothing (no evidence piling up)
    ended, _ = fold(running, _exited(137), now=NOW + 2)
    assert (ended.state, ended.outcome.cause) == (State.FAILED, disruption)
    assert [e.reason for e in ended.outcome.evidence] == ["Preempted", "Error", "Error"]


def test_a_program_that_exits_of_its_own_after_a_disruption_is_its_own_cause() -> None:
    seen = record(
        outcome=Outcome(State.RUNNING, Cause.PREEMPTED, (Evidence("Pod", "job-a-0", reason="Preempted"),))
    )
    ended, _ = fold(seen, _exited(1), now=NOW)
    assert (ended.state, ended.outcome.cause) == (State.FAILED, Cause.EXIT_CODE)
