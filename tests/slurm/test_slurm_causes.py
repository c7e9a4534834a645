"""The cause table without daemons: what a real Slurm 22.05 said in each scenario (recorded by
tools/record_slurm_transcripts.py into tests/slurm/transcripts/), replayed through the pure classifier,
the causes' edges (a cancelled step, a suspension, a memory message that comes late, flags anywhere), and
the generated docs table kept equal to the rules. Every scenario on every version: test_slurm_reader.py."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dispatch import JobSpec
from dispatch.fold import progress
from dispatch.model import Absent, Cause, Compute, Handle, Identity, JobRecord, State
from dispatch_slurm.causes import (
    MEMORY_WORD_WAIT,
    Facts,
    awaits_memory_word,
    cancelled_step,
    classify,
    rules_table,
)
from dispatch_slurm.reader import SlurmJob, dialect_of, parse_squeue
from dispatch_slurm.readings import absent, compute_of, seen

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIPTS = Path(__file__).parent / "transcripts"


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((TRANSCRIPTS / "22.05" / f"{name}.json").read_text())
    return data


V22 = dialect_of("22.05.8")


def facts_of(record: dict[str, Any], *, now: float | None = None) -> Facts:
    """The facts of a recording, read ``now`` (default: long after the job's end, or at its submission)."""
    (job,) = parse_squeue(json.dumps({"jobs": [record["squeue"]]}), V22)
    if now is None:
        now = float(job.end_time + 3600 if job.end_time else record["squeue"]["submit_time"])
    return Facts(
        job=job,
        job_ref=job.job_id,
        now=now,
        output=tuple(record["output"]) if job.state == "FAILED" else (),
    )


def test_the_raw_wait_status_is_decoded() -> None:
    (job,) = parse_squeue(
        json.dumps({"jobs": [{**load("exit3_two_nodes")["squeue"], "exit_code": 768}]}), V22
    )
    assert (job.exit_code, job.signal) == (3, None)


def test_memory_kill_without_the_output_is_an_exit_code() -> None:
    """A SIGKILLed step is out_of_memory only when Slurm's output says it exceeded its limit."""
    facts = facts_of(load("over_memory"))
    bare = Facts(job=facts.job, job_ref=facts.job_ref, now=facts.now, output=("Killed",))
    assert classify(bare).cause is Cause.EXIT_CODE


def test_a_memory_kill_whose_message_is_not_written_yet_is_still_running() -> None:
    """Until slurmstepd's "exceeded memory limit" reaches the output, a SIGKILLed step's job is read as
    still ending, not settled as an exit code — for MEMORY_WORD_WAIT seconds from the job's end as Slurm
    says it (end_time), not from when a process first read it: a supervisor started later reads the
    settled cause at once (it read such a job `running` for 15 s, then scancelled it)."""
    record = load("over_memory")
    end = record["squeue"]["end_time"]
    facts = facts_of(record)
    assert facts.job is not None and facts.job.end_time == end
    assert any("exceeded memory limit" in line for line in facts.output)
    assert not awaits_memory_word(facts.job, facts.output)
    assert awaits_memory_word(facts.job, ("Killed",))
    moments_after = Facts(job=facts.job, job_ref=facts.job_ref, now=end + 2.0, output=("Killed",))
    waiting = classify(moments_after)
    assert (waiting.state, waiting.cause) == (State.RUNNING, Cause.NONE)
    assert waiting.evidence[0].reason == "FAILED/NonZeroExitCode"
    later = classify(
        Facts(job=facts.job, job_ref=facts.job_ref, now=end + MEMORY_WORD_WAIT, output=("Killed",))
    )
    assert (later.state, later.cause) == (State.FAILED, Cause.EXIT_CODE)
    came = classify(Facts(job=facts.job, job_ref=facts.job_ref, now=end + 2.0, output=facts.output))
    assert (came.state, came.cause) == (State.FAILED, Cause.OUT_OF_MEMORY)
    exit3 = facts_of(load("exit3_two_nodes"))
    assert exit3.job is not None and not awaits_memory_word(exit3.job, ())  # not killed: nothing to wait for


# What 22.05 wrote for `scancel JOB.0` of a running `srun sleep 100` (measured here): the job FAILED with
# exit 137 (raw 35072), the node's output holding slurmstepd's line, the batch output srun's.
STEP_CANCELLED = (
    "slurmstepd-n1: error: *** STEP 2.0 ON n1 CANCELLED AT 2026-12-06T12:18:17 ***",
    "srun: Job step aborted: Waiting up to 7 seconds for job step to finish.",
    "srun: error: n1: task 0: Killed",
    "srun: launch/slurm: _step_signal: Terminating StepId=2.0",
)


def test_a_step_cancelled_by_someone_is_cancelled_naming_the_step() -> None:
    """`scancel JOB.0` read failed/exit_code 137, though the output says the step was cancelled."""
    job = SlurmJob(
        "2", "d-x-1-abc", "", "FAILED", reason="NonZeroExitCode", exit_code=137, nodes="n1", end_time=100
    )
    outcome = classify(Facts(job=job, job_ref="2", now=101.0, output=STEP_CANCELLED))
    assert (outcome.state, outcome.cause) == (State.FAILED, Cause.CANCELLED)
    assert "step 2.0 on n1 at 2026-12-06T12:18:17" in outcome.evidence[0].message
    assert outcome.evidence[0].exit_code == 137


def test_a_cancelled_steps_shell_that_reported_its_killed_child_is_still_cancelled() -> None:
    """Seen on 22.05 under load: ``scancel JOB.0`` of ``sh -c 'sleep 600'`` — dash forks ``sleep`` —
    and slurmstepd killed ``sleep`` before ``sh``, which reported it (137) first: srun said "Exited with
    exit code 137" instead of "Killed", and the job read failed/exit_code. A shell's report of a killed
    child is not a task that failed by itself."""
    output = tuple(
        "srun: error: n1: task 0: Exited with exit code 137" if line.endswith("task 0: Killed") else line
        for line in STEP_CANCELLED
    )
    job = SlurmJob(
        "2", "d-x-1-abc", "", "FAILED", reason="NonZeroExitCode", exit_code=137, nodes="n1", end_time=100
    )
    outcome = classify(Facts(job=job, job_ref="2", now=101.0, output=output))
    assert (outcome.state, outcome.cause) == (State.FAILED, Cause.CANCELLED), outcome
    assert "step 2.0 on n1 at 2026-12-06T12:18:17" in outcome.evidence[0].message


@pytest.mark.parametrize("name", ["over_memory", "timeout", "preempted", "exit3_two_nodes"])
def test_slurms_own_step_cancels_are_not_someone_elses(name: str) -> None:
    """A memory kill (its message first), a time limit or a preemption (DUE TO ...), srun stopping the
    tasks of a failed one (24.11 prints the STEP line then too) keep their causes."""
    assert cancelled_step(tuple(load(name)["output"])) is None
    on_24_11 = ("slurmstepd-n1: error: *** STEP 5.0 ON n1 CANCELLED AT 2026-12-06T10:09:12 ***",
                "srun: error: n2: task 1: Exited with exit code 3", "srun: error: n1: task 0: Terminated")  # fmt: skip
    assert cancelled_step(on_24_11) is None


def test_a_suspended_job_is_running_with_the_suspension_in_the_evidence() -> None:
    """`scontrol suspend` read `queued`: the job keeps its nodes (compute present), its processes stopped."""
    for state in ("SUSPENDED", ["SUSPENDED"]):
        entry = {**load("running")["squeue"], "job_state": state}
        (job,) = parse_squeue(
            json.dumps({"jobs": [entry]}), V22 if isinstance(state, str) else dialect_of("24.11.5")
        )
        outcome = classify(Facts(job=job, job_ref=job.job_id, now=1.0))
        assert (outcome.state, outcome.cause) == (State.RUNNING, Cause.NONE)
        assert outcome.evidence[0].reason == "SUSPENDED" and "suspend" in outcome.evidence[0].message


@pytest.mark.parametrize(
    ("job_state", "state", "compute"),
    [
        # 24.11: the end state is known, its compute still ends (the host folds it `stopping`)
        (["CANCELLED", "COMPLETING"], State.CANCELLED, Compute.PRESENT),
        (["COMPLETING", "CANCELLED"], State.CANCELLED, Compute.PRESENT),
        (["CANCELLED"], State.CANCELLED, Compute.GONE),
        ("COMPLETING", State.RUNNING, Compute.PRESENT),  # 22.05 shows the flag instead of the end state
        (["PENDING", "COMPLETING", "REQUEUED"], State.QUEUED, Compute.PRESENT),  # the last run still ends
        (["PENDING", "REQUEUED"], State.QUEUED, Compute.GONE),
        (["RUNNING", "CONFIGURING"], State.STARTING, Compute.PRESENT),  # allocated, its nodes not ready yet
        ("CONFIGURING", State.STARTING, Compute.PRESENT),
        ("SUSPENDED", State.RUNNING, Compute.PRESENT),  # it keeps its nodes, its processes stopped
    ],
)
def test_flags_anywhere_in_the_state(job_state: Any, state: State, compute: Compute) -> None:
    entry = {**load("running")["squeue"], "job_state": job_state}
    dialect = V22 if isinstance(job_state, str) else dialect_of("24.11.5")
    (job,) = parse_squeue(json.dumps({"jobs": [entry]}), dialect)
    reading = seen(Handle("slurm", Identity("f"), job.job_id), job, at=float(entry["submit_time"]))
    assert (reading.state, reading.compute) == (state, compute)


@pytest.mark.parametrize(
    ("job_state", "compute"),
    [
        # 22.05 writes one word, a flag instead of the base state: shown, it says what the base would
        ("REQUEUED", Compute.GONE),  # COMPLETING is shown first: the last run's processes are gone
        ("REQUEUE_HOLD", Compute.GONE),
        ("SPECIAL_EXIT", Compute.GONE),
        ("RESV_DEL_HOLD", Compute.GONE),
        ("STOPPED", Compute.PRESENT),  # its processes stopped on its nodes, not gone
        ("SIGNALING", Compute.PRESENT),
        ("A_STATE_OF_A_LATER_SLURM", Compute.PRESENT),  # listed, not ended: its processes may remain
        (["RUNNING", "A_FLAG_OF_A_LATER_SLURM"], Compute.PRESENT),
        ("PENDING", Compute.GONE),
        ("COMPLETED", Compute.GONE),
    ],
)
def test_a_listed_job_says_whether_its_compute_remains(job_state: Any, compute: Compute) -> None:
    """Conformance's ``readings_say_whether_compute_remains``, for every word Slurm may write: a job squeue
    lists is never of unknown compute — present unless it ended (and is no longer completing) or waits to
    run again."""
    entry = {**load("running")["squeue"], "job_state": job_state}
    (job,) = parse_squeue(
        json.dumps({"jobs": [entry]}), V22 if isinstance(job_state, str) else dialect_of("24.11.5")
    )
    assert compute_of(job) is compute


def test_accounting_alone_tells_only_an_ended_jobs_compute() -> None:
    """A job squeue no longer lists, read from accounting: ended, its compute is gone; shown running (the
    controller forgot a job accounting still has), nothing says whether its processes remain."""
    (job,) = parse_squeue(json.dumps({"jobs": [load("running")["squeue"]]}), V22)
    assert compute_of(replace(job, source="sacct")) is Compute.UNKNOWN
    assert compute_of(replace(job, source="sacct", state="COMPLETED")) is Compute.GONE


def test_the_exit_code_is_the_failing_tasks_not_the_signal_of_the_tasks_srun_stopped() -> None:
    """srun returns the highest exit code of its tasks: when task 0 exits 3 and srun (--kill-on-bad-exit)
    terminates task 1 before it ends by itself, the job shows 143. The exit code is the one srun names
    for the task that exited (seen under load in issue 21's series: a two-node `exit 3` read as 143)."""
    facts = facts_of(load("exit3_two_nodes"))
    assert facts.job is not None
    output = (
        "srun: error: n1: task 0: Exited with exit code 3",
        "srun: launch/slurm: _step_signal: Terminating StepId=16.0",
        "srun: error: n2: task 1: Terminated",
    )
    job = replace(facts.job, exit_code=143, signal=None)
    outcome = classify(Facts(job=job, job_ref=facts.job_ref, now=facts.now, output=output))
    assert (outcome.state, outcome.cause, outcome.evidence[0].exit_code) == (State.FAILED, Cause.EXIT_CODE, 3)
    both = ("srun: error: n[1-2]: tasks 0-1: Exited with exit code 3",)
    assert (
        classify(Facts(job=job, job_ref=facts.job_ref, now=facts.now, output=both)).evidence[0].exit_code == 3
    )
    killed = ("srun: error: n1: task 0: Killed",)  # no task exited by itself: the signal is the answer
    assert (
        classify(Facts(job=replace(job, exit_code=137), job_ref="1", now=facts.now, output=killed))
        .evidence[0]
        .exit_code
        == 137
    )


def test_a_job_gone_from_squeue_and_accounting_is_absent_never_lost() -> None:
    """The adapter read a job neither squeue nor sacct knew as `lost` itself ("SlurmJob/1 Gone: the job
    vanished without an end state"): it is an absent reading, and only the host concludes, from two."""
    handle = Handle("slurm", Identity("gone"), "42")
    reading = absent(handle, at=5.0, kept_by="the completion log (sacct -c)", min_job_age=300)
    assert isinstance(reading, Absent) and reading.handle == handle
    (ev,) = reading.evidence
    assert ev.name == "42" and "sacct -c" in ev.message and "MinJobAge=300" in ev.message


def test_who_cancelled_is_the_records_to_say() -> None:
    """A CANCELLED job reads cancelled; the host's fold makes it `cancelled` when the record asked for the
    cancel (dispatch cancel, from any process) and `failed`/`cancelled` when someone else did."""
    (job,) = parse_squeue(json.dumps({"jobs": [load("cancelled_by_someone")["squeue"]]}), V22)
    handle = Handle("slurm", Identity("c"), job.job_id)
    reading = seen(handle, job, at=float(job.end_time or 0) + 1)
    assert (reading.state, reading.cause, reading.compute) == (State.CANCELLED, Cause.CANCELLED, Compute.GONE)
    rec = JobRecord(
        job_id="c", spec=JobSpec(command=("true",)), created_at=0.0, updated_at=0.0, handle=handle
    )
    assert progress(rec, reading).state is State.FAILED
    assert progress(rec.replace(cancel_requested=True), reading).state is State.CANCELLED


def test_docs_table_is_generated_from_the_rules() -> None:
    text = (ROOT / "docs" / "slurm-causes.md").read_text()
    begin = text.index("-->\n", text.index("<!-- causes-table:begin")) + 4
    end = text.index("<!-- causes-table:end -->")
    assert text[begin:end] == rules_table(), (
        "docs/slurm-causes.md is out of date: regenerate the table with "
        "python -c \"from dispatch_slurm.causes import rules_table; print(rules_table(), end='')\""
    )
