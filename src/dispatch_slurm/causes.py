"""Slurm's word on a job → dispatch's state, cause and evidence (SPEC §13). Pure.

The rules are data (:data:`RULES`, first match wins); ``docs/slurm-causes.md`` is generated from them
(:func:`rules_table`) and a test keeps the two equal. Each rule reads a :class:`Facts`: the job as Slurm
reports it plus what only dispatch knows (whether it cancelled the job itself, whether the start time
is its hold, the last lines of output).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from dispatch.model import Cause, Evidence, Outcome, State
from dispatch_slurm.jobs import SlurmJob

__all__ = ["NEVER_CLEARS", "RULES", "Facts", "Rule", "awaits_memory_word", "classify", "rules_table"]

NEVER_CLEARS = frozenset(
    {
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "BadConstraints",
        "PartitionConfig",
        "InvalidAccount",
        "InvalidQOS",
        "QOSMaxNodePerJobLimit",
        "QOSMaxWallDurationPerJobLimit",
        "ReqNodeNotAvail",
    }
)
"""Pending reasons that cannot clear without someone changing the job or the cluster."""

OOM_MARKERS = ("exceeded memory limit", "oom-kill", "out of memory")
_SIGKILL = 9
_FINAL = frozenset(
    {
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
    }
)


@dataclass(frozen=True, slots=True)
class Facts:
    """What a rule reads. ``job`` is ``None`` when neither squeue nor sacct knows the job any more."""

    job: SlurmJob | None
    job_ref: str
    cancelled_by_us: bool = False
    held_by_us: bool = False
    requeue_by_slurm: bool = False
    output: tuple[str, ...] = ()
    settling: bool = False
    """The job ended FAILED with a SIGKILLed step and no memory message yet, moments ago
    (:func:`awaits_memory_word`): slurmstepd may still be writing why it killed the step."""

    @property
    def state(self) -> str:
        return self.job.state if self.job else ""

    @property
    def reason(self) -> str:
        return self.job.reason if self.job else ""


_TASK_EXITED = re.compile(r": tasks? [0-9,\-]+: Exited with exit code (\d+)")
"""srun's line for tasks that exited by themselves ("srun: error: n1: task 0: Exited with exit code 3")."""


def _exit_code(f: Facts) -> int | None:
    """The job's exit code as the command gave it. srun reports the highest of its tasks' (a signal as
    128 + N), so when a failing task made srun (``--kill-on-bad-exit``) terminate the others, the job
    shows their 143, not the failure's code: that is in srun's own line for the task that exited."""
    j = f.job
    if j is None or j.exit_code is None or j.exit_code <= 128:
        return j.exit_code if j is not None else None
    for line in f.output:
        if (m := _TASK_EXITED.search(line)) is not None and int(m.group(1)) != 0:
            return int(m.group(1))
    return j.exit_code


def _oom_in_output(f: Facts) -> bool:
    text = "\n".join(f.output).lower()
    return any(m in text for m in OOM_MARKERS)


def _killed(f: Facts) -> bool:
    # The step was SIGKILLed: the batch script reports srun's 128+9, or the raw status shows signal 9.
    j = f.job
    return j is not None and (j.signal == _SIGKILL or j.exit_code == 128 + _SIGKILL)


def awaits_memory_word(job: SlurmJob, output: tuple[str, ...]) -> bool:
    """Whether an ended job could still turn out to be a memory kill: Slurm reports it FAILED with a
    SIGKILLed step, and its output holds no memory message yet. slurmstepd writes "exceeded memory
    limit" to the step's output as it kills the step, and under load that line can reach the file after
    the job's end is already reported."""
    f = Facts(job=job, job_ref=job.job_id, output=output)
    return f.state == "FAILED" and (_killed(f) or f.reason == "JobLaunchFailure") and not _oom_in_output(f)


@dataclass(frozen=True, slots=True)
class Rule:
    """When ``when`` holds, the job is ``state``/``cause``; ``slurm`` and ``means`` document it."""

    slurm: str
    state: State
    cause: Cause
    means: str
    when: Callable[[Facts], bool]


RULES: tuple[Rule, ...] = (
    Rule(
        "gone from squeue and sacct",
        State.LOST,
        Cause.UNKNOWN,
        "the job vanished without an end state: its outcome cannot be known",
        lambda f: f.job is None,
    ),
    Rule("COMPLETED", State.SUCCEEDED, Cause.NONE, "every step exited 0", lambda f: f.state == "COMPLETED"),
    Rule(
        "CANCELLED, by dispatch",
        State.CANCELLED,
        Cause.CANCELLED,
        "dispatch cancelled it (stop)",
        lambda f: f.state == "CANCELLED" and f.cancelled_by_us,
    ),
    Rule(
        "CANCELLED, by someone else",
        State.FAILED,
        Cause.CANCELLED,
        "someone cancelled it outside dispatch (scancel); the evidence names who when Slurm says",
        lambda f: f.state == "CANCELLED",
    ),
    Rule(
        "OUT_OF_MEMORY",
        State.FAILED,
        Cause.OUT_OF_MEMORY,
        "the cgroup memory limit killed it",
        lambda f: f.state == "OUT_OF_MEMORY",
    ),
    Rule(
        "FAILED, a step SIGKILLed, no memory message in the output yet, ended moments ago",
        State.RUNNING,
        Cause.NONE,
        "its end is still being written: slurmstepd may yet say it killed the step for its memory "
        "(read again until the message comes, or the wait passes: then the next rules decide)",
        lambda f: f.settling,
    ),
    Rule(
        'FAILED, a step SIGKILLed with "exceeded memory limit" in the output (OverMemoryKill)',
        State.FAILED,
        Cause.OUT_OF_MEMORY,
        "Slurm's memory accounting killed a step over --mem",
        lambda f: (
            f.state == "FAILED" and (_killed(f) or f.reason == "JobLaunchFailure") and _oom_in_output(f)
        ),
    ),
    Rule("TIMEOUT", State.FAILED, Cause.TIMEOUT, "it ran past --time", lambda f: f.state == "TIMEOUT"),
    Rule(
        "NODE_FAIL",
        State.FAILED,
        Cause.NODE_LOST,
        "a node of it stopped answering",
        lambda f: f.state == "NODE_FAIL",
    ),
    Rule(
        "PREEMPTED",
        State.FAILED,
        Cause.PREEMPTED,
        "a job of a higher priority tier took its nodes",
        lambda f: f.state == "PREEMPTED",
    ),
    Rule(
        "FAILED",
        State.FAILED,
        Cause.EXIT_CODE,
        "a step exited non-zero (the raw status decoded: 768 is 3)",
        lambda f: f.state == "FAILED",
    ),
    Rule(
        "BOOT_FAIL, DEADLINE or another end state",
        State.FAILED,
        Cause.UNKNOWN,
        "Slurm ended it for a reason dispatch has no cause for",
        lambda f: f.state in _FINAL,
    ),
    Rule(
        "PENDING, start time pushed by dispatch's hold",
        State.HELD,
        Cause.NONE,
        "dispatch holds it (its start time is ten years ahead)",
        lambda f: f.state == "PENDING" and f.held_by_us,
    ),
    Rule(
        "PENDING, JobHeldUser or JobHeldAdmin",
        State.HELD,
        Cause.NONE,
        "held with scontrol hold",
        lambda f: f.state == "PENDING" and f.reason in ("JobHeldUser", "JobHeldAdmin"),
    ),
    Rule(
        "PENDING with Restarts > 0 (requeue: slurm)",
        State.QUEUED,
        Cause.PREEMPTED,
        "Slurm requeued it itself (a restart in place)",
        lambda f: f.state == "PENDING" and f.requeue_by_slurm and f.job is not None and f.job.restarts > 0,
    ),
    Rule(
        "PENDING, a reason that never clears (PartitionNodeLimit, PartitionTimeLimit, ReqNodeNotAvail, "
        "BadConstraints, ...)",
        State.QUEUED,
        Cause.NO_CAPACITY,
        "the cluster cannot run it as asked",
        lambda f: f.state == "PENDING" and f.reason in NEVER_CLEARS,
    ),
    Rule(
        "PENDING (Priority, Resources, BeginTime, ...)",
        State.QUEUED,
        Cause.NONE,
        "waiting for nodes",
        lambda f: f.state in ("PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED"),
    ),
    Rule(
        "CONFIGURING",
        State.STARTING,
        Cause.NONE,
        "its nodes are being set up",
        lambda f: f.state == "CONFIGURING",
    ),
    Rule(
        "RUNNING, COMPLETING",
        State.RUNNING,
        Cause.NONE,
        "its steps run (or are ending)",
        lambda f: f.state in ("RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"),
    ),
    Rule("anything else", State.RUNNING, Cause.UNKNOWN, "a state this adapter does not know", lambda f: True),
)


def _evidence(f: Facts, rule: Rule) -> Evidence:
    j = f.job
    if j is None:
        return Evidence("SlurmJob", f.job_ref, reason="Gone", message=rule.means)
    reason = j.state if not j.reason or j.reason == "None" else f"{j.state}/{j.reason}"
    message = rule.means
    if j.signal:
        message += f" (signal {j.signal})"
    failed = rule.state is State.FAILED
    return Evidence(
        "SlurmJob",
        j.job_id,
        reason=reason,
        message=message,
        exit_code=_exit_code(f) if (failed or rule.state is State.SUCCEEDED) else None,
        node=j.nodes or None,
        output=f.output if failed else (),
    )


def classify(facts: Facts) -> Outcome:
    """The outcome of the first rule that holds, with evidence naming the Slurm job id, state,
    reason, exit code and node list."""
    for rule in RULES:
        if rule.when(facts):
            return Outcome(rule.state, rule.cause, (_evidence(facts, rule),))
    raise AssertionError("the last rule always holds")


def is_final(state: str) -> bool:
    """Whether Slurm will not run the job again by itself."""
    return state in _FINAL


def rules_table() -> str:
    """The Markdown table of :data:`RULES` (docs/slurm-causes.md holds it)."""
    lines = ["| # | Slurm says | state | cause | meaning |", "| --- | --- | --- | --- | --- |"]
    for i, r in enumerate(RULES, 1):
        lines.append(f"| {i} | {r.slurm} | `{r.state}` | `{r.cause}` | {r.means} |")
    return "\n".join(lines) + "\n"
