"""Record builders shared by the records tests and their child processes."""

from __future__ import annotations

from dispatch import (
    Action,
    Actor,
    Cause,
    Epoch,
    Evidence,
    Extensions,
    Handle,
    Identity,
    Image,
    JobRecord,
    JobSpec,
    Lease,
    OpaqueExtension,
    Outcome,
    Plan,
    PlanAction,
    Policy,
    Rule,
    SharedCheckpoint,
    State,
    Transition,
)

T0 = 1_767_225_600.0  # the ManualClock's default start


def simple_record(
    job_id: str, *, state: State = State.PENDING, counter: int = 0, at: float = T0
) -> JobRecord:
    """A small record whose ``env["COUNTER"]`` tests use as a counter."""
    return JobRecord(
        job_id=job_id,
        spec=JobSpec(command=("python", "train.py"), env={"COUNTER": str(counter)}),
        created_at=at,
        updated_at=at,
        outcome=Outcome(state),
    )


def counter_of(record: JobRecord) -> int:
    return int(record.spec.env["COUNTER"])


def with_counter(record: JobRecord, value: int) -> JobRecord:
    spec = JobSpec(command=record.spec.command, env={**record.spec.env, "COUNTER": str(value)})
    return record.replace(spec=spec)


def full_record(job_id: str = "job-full", at: float = T0) -> JobRecord:
    """A record with every optional part set: extensions (typed and opaque), policy, handle, an outcome
    with evidence, a plan, a lease and the user's intents."""
    epoch = Epoch(3, 2)
    return JobRecord(
        job_id=job_id,
        spec=JobSpec(
            command=("torchrun", "train.py", "--lr", "0.1"),
            nodes=4,
            procs_per_node=8,
            env={"NCCL_DEBUG": "INFO", "EMPTY": ""},
            time_limit=7200,
            extensions=Extensions(
                [
                    Image("ghcr.io/acme/trainer:2.5"),
                    SharedCheckpoint("/mnt/ckpt/run-1"),
                    OpaqueExtension("acme.example/Thing", {"size": [1, 2, 3], "nested": {"on": True}}),
                ]
            ),
        ),
        created_at=at - 100.0,
        updated_at=at - 50.0,
        policy=Policy(
            {Cause.PREEMPTED: Rule(Action.REQUEUE, max=5, backoff=10.0, backoff_cap=600.0)},
            default=Rule(Action.HOLD),
        ),
        epoch=epoch,
        handle=Handle("kubeflow", Identity(job_id, epoch), "team-a/job-full-3"),
        outcome=Outcome(
            State.FAILED,
            Cause.OUT_OF_MEMORY,
            (
                Evidence(
                    kind="Pod",
                    name="job-full-3-node-0-0",
                    reason="OOMKilled",
                    message="container trainer was killed",
                    exit_code=137,
                    node="gpu-node-7",
                    at=at - 60.0,
                    output=("step 10 loss 2.3", "CUDA out of memory"),
                ),
            ),
        ),
        hold_token="hold-abc",
        plan=Plan(PlanAction.FAIL, "out of memory is not retried", not_before=at + 30.0),
        cancel_requested=True,
        hold_requested=True,
        unknown_write="stop",
        revision=9,  # the store decides revisions; this one is ignored
        lease=Lease("supervisor-a", at + 300.0),
    )


def note(what: str, at: float = T0, **kwargs: object) -> Transition:
    return Transition(at=at, actor=Actor.SUPERVISOR, what=what, **kwargs)  # type: ignore[arg-type]
