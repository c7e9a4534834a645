"""Slurm's word on a job → dispatch's state, cause and evidence (SPEC §13). Pure.

The rules are data (:data:`RULES`, first match wins); ``docs/slurm-causes.md`` is generated from them
(:func:`rules_table`) and a test keeps the two equal. Each rule reads a :class:`Facts`: the job as Slurm
reports it plus what the adapter reads beside it (whether the start time is its hold, the last lines of
output). Who asked for a cancel is the record's to know, not this table's: the host's fold makes a
``CANCELLED`` the record did not ask for ``failed``/``cancelled`` (SPEC §5).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from dispatch.model import Cause, Evidence, Outcome, State
from dispatch_slurm.reader import SlurmJob
from dispatch_slurm.settings import HOLD_BASE

__all__ = [
    "MEMORY_WORD_WAIT",
    "NEVER_CLEARS",
    "RULES",
    "Facts",
    "Rule",
    "awaits_memory_word",
    "cancelled_step",
    "classify",
    "rules_table",
]

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

MEMORY_WORD_WAIT = 15.0
"""Seconds after a job's end (Slurm's ``end_time``) during which a FAILED job whose step was SIGKILLed,
with no memory message in its output yet, is still read as ending: on a loaded machine Slurm can report
the end before slurmstepd's "exceeded memory limit" reaches the output file (issue 21's fault series).
Timed from the job's end, so a process that first reads the job later does not wait again."""

OOM_MARKERS = ("exceeded memory limit", "oom-kill", "out of memory")
_SIGKILL = 9
_SIGNALLED = frozenset({128 + _SIGKILL, 128 + 15})
"""Exit codes a shell reports for a child killed by SIGKILL or SIGTERM."""
_STEP_CANCELLED = re.compile(
    r"\*\*\* STEP (?P<step>\d+\.\S+) ON (?P<node>\S+) CANCELLED AT (?P<at>\S+)(?: DUE [Tt][Oo] (?P<due>[^*]*?))? \*\*\*"
)
"""slurmstepd's line for a step it was told to cancel. ``DUE TO`` names Slurm's own reasons (time limit,
preemption, node failure, requeue, a failed task); a signal (``scancel`` of the step) is the line with
no reason up to 24.11, ``DUE to SIGNAL Killed`` from 26.05 on."""
_TASK_EXITED = re.compile(r": tasks? [0-9,\-]+: Exited with exit code (\d+)")
"""srun's line for tasks that exited by themselves ("srun: error: n1: task 0: Exited with exit code 3")."""


@dataclass(frozen=True, slots=True)
class Facts:
    """What a rule reads: the job as Slurm reports it (squeue, or accounting once it left the queue),
    when it was read (``now``, epoch seconds), and what only dispatch knows. A job Slurm no longer knows
    has no facts: its reading is *absent* (:mod:`~dispatch_slurm.readings`), and only the host may
    conclude from it."""

    job: SlurmJob
    job_ref: str
    now: float = 0.0
    requeue_by_slurm: bool = False
    output: tuple[str, ...] = ()
    """The last lines of the job's output, read for a job that ended FAILED or OUT_OF_MEMORY."""

    @property
    def state(self) -> str:
        return self.job.state

    @property
    def flags(self) -> frozenset[str]:
        return self.job.flags

    @property
    def reason(self) -> str:
        return self.job.reason

    @property
    def held_by_us(self) -> bool:
        """Pending with a start time dispatch's hold pushed ten years ahead."""
        j = self.job
        return j.state == "PENDING" and j.eligible_time - self.now > HOLD_BASE / 2

    @property
    def settling(self) -> bool:
        """The job ended FAILED with a SIGKILLed step and no memory message yet, less than
        :data:`MEMORY_WORD_WAIT` seconds ago by Slurm's end time: slurmstepd may still be writing why."""
        j = self.job
        if j.end_time is None or not awaits_memory_word(j, self.output):
            return False
        return self.now - j.end_time < MEMORY_WORD_WAIT


def _exit_code(f: Facts) -> int | None:
    """The job's exit code as the command gave it. srun reports the highest of its tasks' (a signal as
    128 + N), so when a failing task made srun (``--kill-on-bad-exit``) terminate the others, the job
    shows their 143, not the failure's code: that is in srun's own line for the task that exited."""
    j = f.job
    if j.exit_code is None or j.exit_code <= 128:
        return j.exit_code
    code = _task_exit(f.output)
    return code if code is not None else j.exit_code


def _task_exit(output: tuple[str, ...]) -> int | None:
    for line in output:
        if (m := _TASK_EXITED.search(line)) is not None and int(m.group(1)) != 0:
            return int(m.group(1))
    return None


def _own_exit(output: tuple[str, ...]) -> int | None:
    """The exit code of a task that failed by itself: not 128 + SIGKILL or SIGTERM, which is a task whose
    shell (``sh -c CMD`` waits for CMD) saw its child killed and reported it before it was killed too —
    under load, when a cancelled step's processes are killed one by one (proctrack/linuxproc)."""
    for line in output:
        if (m := _TASK_EXITED.search(line)) is not None and int(m.group(1)) not in _SIGNALLED:
            code = int(m.group(1))
            if code != 0:
                return code
    return None


def _oom_in_output(output: tuple[str, ...]) -> bool:
    text = "\n".join(output).lower()
    return any(m in text for m in OOM_MARKERS)


def _killed(job: SlurmJob) -> bool:
    # The step was SIGKILLed: the batch script reports srun's 128+9, or the status shows signal 9.
    return job.signal == _SIGKILL or job.exit_code == 128 + _SIGKILL


def cancelled_step(output: tuple[str, ...]) -> str | None:
    """The step someone cancelled (``scancel JOB.STEP``) as its output tells it (``"12.0 on n1 at
    2026-12-06T12:18:17"``), or ``None``. Not Slurm's own cancels (``DUE TO TIME LIMIT``, ``DUE TO
    PREEMPTION``...), not a memory kill (its message comes first), and not srun's ``--kill-on-bad-exit``
    after a task exited non-zero (24.11 prints the same line for the tasks it stops then, 26.05 ``DUE
    TO TASK FAILURE``)."""
    if _oom_in_output(output) or _own_exit(output) is not None:
        return None
    for line in output:
        m = _STEP_CANCELLED.search(line)
        if m is not None and (m.group("due") is None or m.group("due").startswith("SIGNAL")):
            return f"{m.group('step')} on {m.group('node')} at {m.group('at')}"
    return None


def awaits_memory_word(job: SlurmJob, output: tuple[str, ...]) -> bool:
    """Whether an ended job could still turn out to be a memory kill: Slurm reports it FAILED with a
    SIGKILLed step, and its output holds neither a memory message nor the line of a step cancelled by
    someone (slurmstepd writes "exceeded memory limit" before it asks for the step's cancel, so that
    line comes after). Under load the memory line can reach the file after the job's end is reported."""
    killed = _killed(job) or job.reason == "JobLaunchFailure"
    return job.state == "FAILED" and killed and not _oom_in_output(output) and cancelled_step(output) is None


@dataclass(frozen=True, slots=True)
class Rule:
    """When ``when`` holds, the job is ``state``/``cause``; ``slurm`` and ``means`` document it."""

    slurm: str
    state: State
    cause: Cause
    means: str
    when: Callable[[Facts], bool]


RULES: tuple[Rule, ...] = (
    Rule("COMPLETED", State.SUCCEEDED, Cause.NONE, "every step exited 0", lambda f: f.state == "COMPLETED"),
    Rule(
        "CANCELLED",
        State.CANCELLED,
        Cause.CANCELLED,
        "scancel ended it: the record says whether dispatch asked (dispatch cancel: cancelled) or someone "
        "else did (failed/cancelled); the evidence names who when Slurm says",
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
        "FAILED, a step SIGKILLed, no memory message in the output yet, ended under 15 s ago",
        State.RUNNING,
        Cause.NONE,
        "its end is still being written: slurmstepd may yet say it killed the step for its memory "
        "(read again until the message comes, or 15 s from the job's end pass: then the next rules decide)",
        lambda f: f.settling,
    ),
    Rule(
        'FAILED, a step SIGKILLed with "exceeded memory limit" in the output (OverMemoryKill)',
        State.FAILED,
        Cause.OUT_OF_MEMORY,
        "Slurm's memory accounting killed a step over --mem",
        lambda f: (
            f.state == "FAILED"
            and (_killed(f.job) or f.reason == "JobLaunchFailure")
            and _oom_in_output(f.output)
        ),
    ),
    Rule(
        'FAILED, "*** STEP J.S ... CANCELLED" in the output, not DUE TO Slurm (scancel JOB.STEP)',
        State.FAILED,
        Cause.CANCELLED,
        "someone cancelled a step of it outside dispatch (scancel JOB.STEP); the evidence names the step",
        lambda f: f.state == "FAILED" and cancelled_step(f.output) is not None,
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
        "FAILED with a reason that never clears (BadConstraints, ...): sbatch refused it",
        State.FAILED,
        Cause.INVALID_SPEC,
        "Slurm refused it as asked (sbatch failed, yet 22.05 keeps the job's record, FAILED)",
        lambda f: f.state == "FAILED" and f.reason in NEVER_CLEARS,
    ),
    Rule(
        "FAILED",
        State.FAILED,
        Cause.EXIT_CODE,
        "a step exited non-zero (a raw status decoded: 768 is 3; or the exit_code object's return_code)",
        lambda f: f.state == "FAILED",
    ),
    Rule(
        "BOOT_FAIL, DEADLINE or another end state",
        State.FAILED,
        Cause.UNKNOWN,
        "Slurm ended it for a reason dispatch has no cause for",
        lambda f: f.job.final,
    ),
    Rule(
        "PENDING, start time pushed by dispatch's hold",
        State.HELD,
        Cause.NONE,
        "dispatch holds it (its start time is ten years ahead)",
        lambda f: f.held_by_us,
    ),
    Rule(
        "PENDING, JobHeldUser or JobHeldAdmin; REQUEUE_HOLD",
        State.HELD,
        Cause.NONE,
        "held with scontrol hold (or requeued held by an admin)",
        lambda f: (
            (f.state == "PENDING" and f.reason in ("JobHeldUser", "JobHeldAdmin"))
            or "REQUEUE_HOLD" in f.flags
        ),
    ),
    Rule(
        "PENDING with Restarts > 0 (requeue: slurm)",
        State.QUEUED,
        Cause.PREEMPTED,
        "Slurm requeued it itself (a restart in place)",
        lambda f: f.state == "PENDING" and f.requeue_by_slurm and f.job.restarts > 0,
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
        "PENDING (Priority, Resources, BeginTime, ...); REQUEUED",
        State.QUEUED,
        Cause.NONE,
        "waiting for nodes",
        lambda f: f.state == "PENDING" or bool(f.flags & {"REQUEUED", "REQUEUE_FED", "SPECIAL_EXIT"}),
    ),
    Rule(
        "SUSPENDED (scontrol suspend)",
        State.RUNNING,
        Cause.NONE,
        "suspended (scontrol suspend): it keeps its nodes, its processes stopped until scontrol resume",
        lambda f: f.state == "SUSPENDED",
    ),
    Rule(
        "CONFIGURING",
        State.STARTING,
        Cause.NONE,
        "its nodes are being set up",
        lambda f: "CONFIGURING" in f.flags,
    ),
    Rule(
        "RUNNING; COMPLETING with no end state shown (22.05, 23.02)",
        State.RUNNING,
        Cause.NONE,
        "its steps run (or are ending)",
        lambda f: (
            f.state == "RUNNING" or bool(f.flags & {"COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"})
        ),
    ),
    Rule("anything else", State.RUNNING, Cause.UNKNOWN, "a state this adapter does not know", lambda f: True),
)


def _evidence(f: Facts, rule: Rule) -> Evidence:
    j = f.job
    reason = j.shown if not j.reason or j.reason == "None" else f"{j.shown}/{j.reason}"
    message = rule.means
    if rule.cause is Cause.CANCELLED and (step := cancelled_step(f.output)) is not None:
        message += f": step {step}"
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


def rules_table() -> str:
    """The Markdown table of :data:`RULES` (docs/slurm-causes.md holds it)."""
    lines = ["| # | Slurm says | state | cause | meaning |", "| --- | --- | --- | --- | --- |"]
    for i, r in enumerate(RULES, 1):
        lines.append(f"| {i} | {r.slurm} | `{r.state}` | `{r.cause}` | {r.means} |")
    return "\n".join(lines) + "\n"
