"""The pure fold of observations into records: a table of cases, then properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dispatch import (
    Actor,
    Cause,
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


def obs(state: State, cause: Cause = Cause.NONE, h: Handle | None = None, reason: str = "") -> Observation:
    evidence = (Evidence("Pod", "job-a-0", reason=reason),) if reason else ()
    return Observation(h or handle(), Outcome(state, cause, evidence), at=NOW - 1)


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


def test_a_cancel_requested_does_not_end_a_job_the_cluster_still_runs() -> None:
    rec = record(outcome=Outcome(State.QUEUED), cancel_requested=True)
    new, _ = fold(rec, obs(State.RUNNING), now=NOW)
    assert new.state is State.RUNNING


def test_an_observation_settles_an_unknown_start_and_adopts_the_handle() -> None:
    rec = record(handle=None, unknown_write="start of job-a@1.0: response lost")
    new, ts = fold(rec, obs(State.QUEUED), now=NOW)
    assert new.handle == handle()
    assert new.unknown_write is None
    assert [t.what for t in ts] == ["settled", "queued"]


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


@given(records, observations)
def test_a_cancelled_by_user_record_that_ends_ends_cancelled(
    rec: JobRecord, observation: Observation
) -> None:
    new, _ = fold(rec, observation, now=NOW)
    if rec.cancel_requested and not rec.outcome.terminal and new.outcome.terminal:
        assert (new.state, new.outcome.cause) == (State.CANCELLED, Cause.CANCELLED)
