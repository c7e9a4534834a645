"""The cause table without daemons: what a real Slurm 22.05 said in each scenario (recorded by
tools/record_slurm_transcripts.py into tests/slurm/transcripts/), replayed through the pure classifier,
and the generated docs table kept equal to the rules."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from dispatch.model import Cause, State
from dispatch_slurm.causes import Facts, awaits_memory_word, classify, rules_table
from dispatch_slurm.jobs import parse_sacct, parse_squeue
from dispatch_slurm.naming import parse_comment
from dispatch_slurm.settings import HOLD_BASE

ROOT = Path(__file__).resolve().parents[2]
TRANSCRIPTS = Path(__file__).parent / "transcripts"

# scenario → (state, cause, exit code in the evidence, the evidence's reason)
EXPECTED: dict[str, tuple[State, Cause, int | None, str]] = {
    "completed": (State.SUCCEEDED, Cause.NONE, 0, "COMPLETED"),
    "exit3_two_nodes": (State.FAILED, Cause.EXIT_CODE, 3, "FAILED/NonZeroExitCode"),
    "over_memory": (State.FAILED, Cause.OUT_OF_MEMORY, 137, "FAILED/NonZeroExitCode"),
    "timeout": (State.FAILED, Cause.TIMEOUT, 143, "TIMEOUT/TimeLimit"),  # raw 36608: SIGTERMed, 128+15
    "node_fail": (State.FAILED, Cause.NODE_LOST, 0, "NODE_FAIL/NodeDown"),
    "preempted": (State.FAILED, Cause.PREEMPTED, 143, "PREEMPTED"),
    "cancelled_by_dispatch": (State.CANCELLED, Cause.CANCELLED, None, "CANCELLED"),
    "cancelled_by_someone": (State.FAILED, Cause.CANCELLED, 0, "CANCELLED"),
    "held_by_dispatch": (State.HELD, Cause.NONE, None, "PENDING/BeginTime"),
    "running": (State.RUNNING, Cause.NONE, None, "RUNNING"),
}


def load(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((TRANSCRIPTS / f"{name}.json").read_text())
    return data


def facts_of(record: dict[str, Any]) -> Facts:
    (job,) = parse_squeue(json.dumps({"jobs": [record["squeue"]]}))
    marks = parse_comment(job.comment)
    now = float(record["squeue"]["submit_time"])
    return Facts(
        job=job,
        job_ref=job.job_id,
        cancelled_by_us=marks is not None and marks.cancelled,
        held_by_us=job.state == "PENDING" and job.eligible_time - now > HOLD_BASE / 2,
        output=tuple(record["output"]) if job.state == "FAILED" else (),
    )


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recorded_squeue_classifies_as_section_13_says(name: str) -> None:
    record = load(name)
    outcome = classify(facts_of(record))
    state, cause, exit_code, reason = EXPECTED[name]
    assert (outcome.state, outcome.cause) == (state, cause), outcome
    (ev,) = outcome.evidence
    assert ev.kind == "SlurmJob" and ev.name == str(record["squeue"]["job_id"])
    assert ev.reason == reason
    assert ev.exit_code == exit_code
    assert ev.node == (record["squeue"]["nodes"] or None)


def test_the_raw_wait_status_is_decoded() -> None:
    (job,) = parse_squeue(json.dumps({"jobs": [load("exit3_two_nodes")["squeue"]]}))
    assert load("exit3_two_nodes")["squeue"]["exit_code"] == 768
    assert (job.exit_code, job.signal) == (3, 0)


def test_memory_kill_without_the_output_is_an_exit_code() -> None:
    """A SIGKILLed step is out_of_memory only when Slurm's output says it exceeded its limit."""
    facts = facts_of(load("over_memory"))
    bare = Facts(job=facts.job, job_ref=facts.job_ref, output=("Killed",))
    assert classify(bare).cause is Cause.EXIT_CODE


def test_a_memory_kill_whose_message_is_not_written_yet_is_still_running() -> None:
    """Until slurmstepd's "exceeded memory limit" reaches the output, a SIGKILLed step's job is read as
    still ending, not settled as an exit code (the backend bounds how long: test_slurm_scenarios)."""
    facts = facts_of(load("over_memory"))
    assert facts.job is not None and any("exceeded memory limit" in line for line in facts.output)
    assert not awaits_memory_word(facts.job, facts.output)
    assert awaits_memory_word(facts.job, ("Killed",))
    waiting = classify(Facts(job=facts.job, job_ref=facts.job_ref, output=("Killed",), settling=True))
    assert (waiting.state, waiting.cause) == (State.RUNNING, Cause.NONE)
    assert waiting.evidence[0].reason == "FAILED/NonZeroExitCode"
    exit3 = facts_of(load("exit3_two_nodes"))
    assert exit3.job is not None and not awaits_memory_word(exit3.job, ())  # not killed: nothing to wait for


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
    job = replace(facts.job, exit_code=143, signal=0)
    outcome = classify(Facts(job=job, job_ref=facts.job_ref, output=output))
    assert (outcome.state, outcome.cause, outcome.evidence[0].exit_code) == (State.FAILED, Cause.EXIT_CODE, 3)
    both = ("srun: error: n[1-2]: tasks 0-1: Exited with exit code 3",)
    assert classify(Facts(job=job, job_ref=facts.job_ref, output=both)).evidence[0].exit_code == 3
    killed = ("srun: error: n1: task 0: Killed",)  # no task exited by itself: the signal is the answer
    assert (
        classify(Facts(job=replace(job, exit_code=137), job_ref="1", output=killed)).evidence[0].exit_code
        == 137
    )


@pytest.mark.parametrize("name", sorted(n for n in EXPECTED if load(n)["sacct"]))
def test_recorded_sacct_lines_after_the_queue_forgot_the_job(name: str) -> None:
    """The completion log keeps no comment: a job that left squeue reads from it (who cancelled comes
    from the cancelled-by-dispatch file, not tested here)."""
    record = load(name)
    (job,) = parse_sacct(record["sacct"])
    assert job.job_id == str(record["squeue"]["job_id"]) and job.source == "sacct"
    outcome = classify(Facts(job=job, job_ref=job.job_id, output=tuple(record["output"])))
    state, cause, _, _ = EXPECTED[name]
    if name == "cancelled_by_dispatch":
        state = State.FAILED  # without the file, a cancel is someone else's
    if name == "exit3_two_nodes":
        assert outcome.evidence[0].exit_code == 3  # sacct's 3:0 (its JSON would lose it)
    assert (outcome.state, outcome.cause) == (state, cause), outcome


def test_a_job_gone_from_squeue_and_sacct_is_lost() -> None:
    outcome = classify(Facts(job=None, job_ref="42"))
    assert (outcome.state, outcome.cause) == (State.LOST, Cause.UNKNOWN)
    assert outcome.evidence[0].name == "42"


def test_docs_table_is_generated_from_the_rules() -> None:
    text = (ROOT / "docs" / "slurm-causes.md").read_text()
    begin = text.index("-->\n", text.index("<!-- causes-table:begin")) + 4
    end = text.index("<!-- causes-table:end -->")
    assert text[begin:end] == rules_table(), (
        "docs/slurm-causes.md is out of date: regenerate the table with "
        "python -c \"from dispatch_slurm.causes import rules_table; print(rules_table(), end='')\""
    )
