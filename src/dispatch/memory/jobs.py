"""A job on the memory cluster, and the rules of its timeline (pure): :class:`Job`.

What a job shows (:func:`outcome_of`), the evidence it gives, how its ranks end (:func:`replan`) and
fail (:func:`failure`), how long its compute lingers once stopped (:func:`linger`), the changes it has
coming (:func:`events`), and the object that stands for it (:func:`native_object`). The cluster
(:class:`~dispatch.memory.cluster.MemoryCluster`) keeps the jobs and moves them along these rules.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from dispatch.errors import InvalidError
from dispatch.memory.naming import (
    ANNOTATION_EPOCH,
    ANNOTATION_JOB_ID,
    ANNOTATION_NONCE,
    LABEL_MANAGED_BY,
    MANAGED_BY,
)
from dispatch.memory.script import SCRIPT_ENV, RankPlan, Step
from dispatch.model import (
    Cause,
    Compute,
    Evidence,
    Handle,
    Identity,
    Image,
    JobSpec,
    Outcome,
    SharedCheckpoint,
    State,
)

__all__ = [
    "API_VERSION",
    "KIND_JOB",
    "KIND_NODE",
    "Job",
    "Phase",
    "compute",
    "events",
    "evidence",
    "failure",
    "gone_evidence",
    "image_problem",
    "job_env",
    "linger",
    "native_object",
    "outcome_of",
    "replan",
    "tail",
]

API_VERSION = "memory.dispatch.dev/v1"
KIND_JOB = "MemoryJob"
KIND_NODE = "MemoryNode"
OUTPUT_TAIL = 50  # printed lines kept as evidence of a failure


class Phase(StrEnum):
    """Where a job is in its life on the memory cluster."""

    QUEUED = "queued"
    HELD = "held"
    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"


def image_problem(ref: str) -> str | None:
    """Why an image cannot be pulled, or None. The memory cluster cannot resolve a registry host that
    ends ``.invalid`` (the reserved top-level domain), so such images fail to pull."""
    first, sep, _ = ref.partition("/")
    host = first if sep and ("." in first or ":" in first or first == "localhost") else "docker.io"
    host = host.split(":")[0]
    if host.endswith(".invalid"):
        return f'cannot pull image "{ref}": registry host "{host}" does not resolve'
    return None


@dataclass(eq=False)
class Job:
    """One incarnation on the memory cluster, with its timeline (mutated by the cluster alone)."""

    seq: int
    name: str
    handle: Handle
    spec: JobSpec
    env: dict[str, str]
    steps: tuple[Step, ...]
    held_at_create: bool
    created_at: float
    phase: Phase
    since: float
    hold_token: str | None = None
    nodes: tuple[str, ...] = ()  # compute currently allocated (also while lingering after an end)
    compute_until: float | None = None  # set once the compute is going away
    running_at: float = 0.0
    deadline: float | None = None
    pull_fail_at: float | None = None
    plans: tuple[RankPlan, ...] = ()
    planned_end: tuple[float, int] | None = None  # (time, rank) the job ends by itself
    forced_hang: bool = False
    forced_linger: float | None = None
    outcome: Outcome | None = None  # once DONE
    emitted: tuple[Outcome, Compute] | None = None
    image_error: str | None = None
    version: int = 0  # bumped on every change; older timers of the job are ignored

    @property
    def identity(self) -> Identity:
        return self.handle.identity

    @property
    def live(self) -> bool:
        return self.phase is not Phase.DONE


def evidence(
    job: Job,
    reason: str,
    message: str,
    t: float,
    *,
    exit_code: int | None = None,
    rank: int | None = None,
    output: tuple[str, ...] = (),
) -> Evidence:
    """Evidence of ``job`` at ``t``, naming the node of ``rank`` (else its first node)."""
    node: str | None = None
    if rank is not None and rank < len(job.nodes):
        node = job.nodes[rank]
    elif job.nodes:
        node = job.nodes[0]
    return Evidence(
        KIND_JOB,
        job.name,
        reason,
        message,
        exit_code=exit_code,
        node=node,
        at=t,
        output=output,
        rank=rank,
    )


def outcome_of(job: Job, nodes: int) -> Outcome:
    """The folded outcome of a job as the cluster shows it now, on a cluster of ``nodes`` nodes."""
    if job.outcome is not None:
        return job.outcome
    t = job.since
    if job.phase is Phase.QUEUED:
        message = f"waiting for {job.spec.nodes} free node(s) of {nodes}"
        return Outcome(State.QUEUED, Cause.NO_CAPACITY, (evidence(job, "InsufficientNodes", message, t),))
    if job.phase is Phase.HELD:
        ev = evidence(job, "Held", "held by dispatch; release it to run", t)
        return Outcome(State.HELD, Cause.NONE, (ev,))
    where = ", ".join(job.nodes)
    if job.phase is Phase.STARTING:
        if job.image_error:
            ev = evidence(job, "ErrImagePull", job.image_error, t)
            return Outcome(State.STARTING, Cause.IMAGE_PULL, (ev,))
        return Outcome(State.STARTING, Cause.NONE, (evidence(job, "Starting", f"starting on {where}", t),))
    return Outcome(State.RUNNING, Cause.NONE, (evidence(job, "Running", f"running on {where}", t),))


def linger(job: Job, t: float, cessation_delay: float) -> float:
    """How long the compute stays after being told to stop at ``t`` (``cessation_delay``: by default)."""
    if not job.nodes:
        return 0.0
    if job.forced_linger is not None:
        return job.forced_linger
    if job.phase is not Phase.RUNNING:
        return cessation_delay
    # Each rank's last slow-stop reached replaces cessationDelay for it; the slowest rank decides.
    ran = t - job.running_at
    lingers = []
    for plan in job.plans:
        reached = [s for at, s in plan.slow_stops if at <= ran]
        lingers.append(reached[-1] if reached else cessation_delay)
    return max(lingers, default=cessation_delay)


def events(job: Job) -> list[tuple[float, int, str]]:
    """The job's coming changes: (time, priority, kind), in no order."""
    out: list[tuple[float, int, str]] = []
    if job.nodes and job.compute_until is not None:
        out.append((job.compute_until, 0, "release"))
    if job.phase is Phase.STARTING:
        if job.pull_fail_at is not None:
            out.append((job.pull_fail_at, 3, "pull-failed"))
        else:
            out.append((job.running_at, 1, "running"))
    if job.phase is Phase.RUNNING and job.planned_end is not None:
        out.append((job.planned_end[0], 2, "end"))
    if job.live and job.phase in (Phase.STARTING, Phase.RUNNING) and job.deadline is not None:
        out.append((job.deadline, 4, "timeout"))
    return out


def replan(job: Job) -> None:
    """When, and by which rank, a job that began running ends by itself (``None``: it runs until stopped)."""
    if job.forced_hang:
        job.planned_end = None
        return
    ends = [(job.running_at + p.end, rank, p) for rank, p in enumerate(job.plans) if p.end is not None]
    failures = sorted((t, rank) for t, rank, p in ends if p.failed)
    if failures:
        job.planned_end = failures[0]
    elif len(ends) == len(job.plans):
        last = max(ends, key=lambda e: (e[0], e[1]))
        job.planned_end = (last[0], last[1])
    else:
        job.planned_end = None  # a rank hangs: it runs until stopped or timed out


def tail(job: Job, rank: int, t: float) -> tuple[str, ...]:
    """The last lines rank ``rank`` printed by ``t`` (evidence of a failure)."""
    if job.phase is not Phase.RUNNING or rank >= len(job.plans):
        return ()
    ran = t - job.running_at
    return tuple(text for at, text in job.plans[rank].lines if at <= ran)[-OUTPUT_TAIL:]


def failure(job: Job, t: float, rank: int, verb: str, code: int = 0) -> Outcome:
    """The outcome of rank ``rank`` failing by ``verb`` at ``t`` (``code``: an exit's)."""
    node = job.nodes[rank] if rank < len(job.nodes) else None
    where = f"node {rank} ({node})"
    output = tail(job, rank, t)
    if verb == "exit":
        ev = evidence(
            job, "Error", f"{where} exited with code {code}", t, exit_code=code, rank=rank, output=output
        )
        outcome = Outcome(State.FAILED, Cause.EXIT_CODE, (ev,))
    elif verb == "oom":
        ev = evidence(
            job,
            "OOMKilled",
            f"{where} was killed: out of memory",
            t,
            exit_code=137,
            rank=rank,
            output=output,
        )
        outcome = Outcome(State.FAILED, Cause.OUT_OF_MEMORY, (ev,))
    elif verb == "preempt":
        ev = evidence(
            job, "Preempted", f"{where} was preempted by the scheduler", t, rank=rank, output=output
        )
        outcome = Outcome(State.FAILED, Cause.PREEMPTED, (ev,))
    elif verb == "evict":
        ev = evidence(job, "Evicted", f"{where} was evicted", t, rank=rank, output=output)
        outcome = Outcome(State.FAILED, Cause.EVICTED, (ev,))
    elif verb == "lose-node":
        ev = Evidence(
            KIND_NODE,
            node or "unknown",
            "NodeLost",
            f"node {node} was lost while running rank {rank} of {job.name}",
            node=node,
            at=t,
            output=output,
        )
        outcome = Outcome(State.FAILED, Cause.NODE_LOST, (ev,))
    else:  # pragma: no cover - verbs are checked when parsed
        raise InvalidError(f"not a fault: {verb!r}", path="action")
    return outcome


def compute(job: Job) -> Compute:
    return Compute.PRESENT if job.nodes else Compute.GONE


def gone_evidence(name: str, t: float) -> Evidence:
    return Evidence(
        KIND_JOB, name, "NotFound", "the memory cluster has no job of this name, nor its compute", at=t
    )


def job_env(spec: JobSpec, identity: Identity) -> dict[str, str]:
    """The environment a job's nodes see: the spec's env plus dispatch's own variables."""
    env = dict(spec.env)
    env.update(identity.env())
    checkpoint = spec.extensions.get(SharedCheckpoint)
    if checkpoint is not None:
        env[SharedCheckpoint.ENV] = checkpoint.dir
    return env


def native_object(
    name: str, spec: JobSpec, identity: Identity, *, held: bool, status: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The memory cluster's object for one incarnation (the request ``prepare`` returns)."""
    body: dict[str, Any] = {
        "command": list(spec.command),
        "nodes": spec.nodes,
        "env": job_env(spec, identity),
        "held": held,
    }
    if spec.procs_per_node is not None:
        body["procsPerNode"] = spec.procs_per_node
    if spec.time_limit is not None:
        body["timeLimit"] = spec.time_limit
    image = spec.extensions.get(Image)
    if image is not None:
        body["image"] = image.ref
    if SCRIPT_ENV in spec.env:
        body["script"] = spec.env[SCRIPT_ENV]
    obj: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND_JOB,
        "metadata": {
            "name": name,
            "labels": {LABEL_MANAGED_BY: MANAGED_BY},
            "annotations": {
                ANNOTATION_JOB_ID: identity.job_id,
                ANNOTATION_EPOCH: str(identity.epoch),
                **({ANNOTATION_NONCE: identity.nonce} if identity.nonce else {}),
            },
        },
        "spec": body,
    }
    if status is not None:
        obj["status"] = copy.deepcopy(dict(status))
    return obj  # built afresh (the env too: job_env copies it), so independent of the spec's mappings
