"""The simulated cluster behind the ``memory`` adapter: nodes, a FIFO queue, jobs with timelines.

There are no background tasks. Every scheduled change (a job starting to run, ending, timing out, its
compute going away) has a time; whoever looks at the cluster first advances it to the clock's ``now``,
processing the due changes in time order (and admitting queued jobs as capacity frees). So the state is a
function of the clock and of what was done to the cluster, and a :class:`~dispatch.clock.ManualClock`
makes every test deterministic. Every change of a job's reading (its outcome, and whether its compute
is still there) is appended to a bounded change log that :meth:`MemoryCluster.changes` serves, as an API
server's watch history serves a list+watch.

It is never kinder than a real cluster: a failing job shows ``starting`` for a moment before it fails
(the real controllers do, while a pod has failed and the job's condition is not written yet), a job's
compute lingers after it ends (``cessationDelay``: pods terminating), and the cluster can be made
unreachable for a while — down, or answering partially, or with an errors list (:meth:`outage`) — as
slurmctld restarts and API servers fail.
"""

from __future__ import annotations

import asyncio
import bisect
import copy
import heapq
import json
import random
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from dispatch import chance
from dispatch.clock import Clock
from dispatch.errors import ConflictError, InvalidError, NotFoundError, UnavailableError
from dispatch.memory.naming import (
    ANNOTATION_EPOCH,
    ANNOTATION_JOB_ID,
    ANNOTATION_NONCE,
    LABEL_MANAGED_BY,
    MANAGED_BY,
)
from dispatch.memory.script import SCRIPT_ENV, RankPlan, Step, plan_rank
from dispatch.memory.settings import MemorySettings
from dispatch.model import (
    Absent,
    Cause,
    Compute,
    Evidence,
    Handle,
    Identity,
    Image,
    JobSpec,
    Observation,
    Outcome,
    SharedCheckpoint,
    State,
)

__all__ = [
    "API_VERSION",
    "KIND_JOB",
    "KIND_NODE",
    "OUTAGES",
    "Item",
    "MemoryCluster",
    "Overlap",
    "image_problem",
]

API_VERSION = "memory.dispatch.dev/v1"
KIND_JOB = "MemoryJob"
KIND_NODE = "MemoryNode"
OUTPUT_TAIL = 50  # printed lines kept as evidence of a failure

Item = Observation | Absent
"""A reading the cluster's change log holds."""

OUTAGES = ("down", "partial", "errors")
"""How the cluster can fail to answer (:meth:`MemoryCluster.outage`): not at all, with only some of its
jobs, or with an empty answer that carries an errors list (Slurm's JSON with slurmctld down)."""


class Phase(StrEnum):
    QUEUED = "queued"
    HELD = "held"
    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"


@dataclass(frozen=True, slots=True)
class Overlap:
    """Two incarnations of one job had compute at the same time (what cessation exists to prevent)."""

    running: Identity
    started: Identity
    at: float


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
class _Job:
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


class MemoryCluster:
    """A small simulated cluster. Shared by every :class:`~dispatch.memory.MemoryBackend` opened on it."""

    def __init__(
        self,
        settings: MemorySettings | None = None,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        from dispatch.clock import SystemClock

        self.settings = settings or MemorySettings()
        self.clock: Clock = clock or SystemClock()
        self.rng = chance.source(rng)
        self.id = f"memory:{chance.token(self.rng, 6)}"
        """This cluster's identity (``Backend.cluster_id``): each in-process cluster is a cluster of its own."""
        self._stores: dict[str, str] = {}  # job name -> the identity of the store that created it
        self._time = self.clock.now()
        self._jobs: dict[str, _Job] = {}
        self._vanished: dict[str, Absent] = {}  # by name: jobs deleted behind dispatch's back
        self._queue: list[tuple[int, str]] = []  # (seq, name), creation order: strict FIFO
        self._free = [f"node-{i}" for i in range(self.settings.nodes)]
        self._seq = 0
        self._tokens = 0
        self._log: deque[Item] = deque(maxlen=self.settings.watch_history)
        self._outage: tuple[float, str] | None = None  # (until, how) the cluster does not answer
        self._log_seq = 0  # sequence number of the newest change
        self._dirty: dict[str, _Job] = {}
        self._active_jobs: dict[str, _Job] = {}  # starting, running, or with compute
        # (time, priority, job seq, job version, kind, job): stale once the job's version moved on
        self._timers: list[tuple[float, int, int, int, str, _Job]] = []
        self._incarnations: dict[str, list[_Job]] = {}  # by job id
        self._wake = asyncio.Event()
        self._wake_loop: asyncio.AbstractEventLoop | None = None
        self.overlaps: list[Overlap] = []
        """Every time an incarnation got compute while another incarnation of the same job still had
        some (a supervisor that does not wait for cessation shows up here)."""

    # --- time -----------------------------------------------------------------------------------

    def sync(self) -> float:
        """Advance the simulation to the clock's now, processing due changes in order. Returns now."""
        now = max(self.clock.now(), self._time)
        fired = False
        while True:
            due = self._next_due(now)
            if due is None:
                break
            t, _, _, job, kind = due
            self._fire(job, kind, t)
            self._admit(t)
            self._flush(t)
            fired = True
        self._time = now
        self._admit(now)
        self._flush(now)
        if fired:
            self._notify()
        return now

    def next_change_time(self) -> float | None:
        """When the next scheduled change happens (None: nothing will change until someone acts); the
        end of an outage counts (what could not be read can be read again then)."""
        top = self._peek()
        times = [top[0]] if top is not None else []
        if self._outage is not None:
            times.append(self._outage[0])
        return min(times) if times else None

    def _peek(self) -> tuple[float, int, int, int, str, _Job] | None:
        """The earliest timer still valid (timers of a job are replaced whenever it changes)."""
        while self._timers:
            top = self._timers[0]
            if top[5].version == top[3] and self._jobs.get(top[5].name) is top[5]:
                return top
            heapq.heappop(self._timers)
        return None

    def _events(self, job: _Job) -> list[tuple[float, int, str]]:
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

    def _next_due(self, now: float) -> tuple[float, int, int, _Job, str] | None:
        top = self._peek()
        if top is None or top[0] > now:
            return None
        heapq.heappop(self._timers)
        t, prio, seq, _, kind, job = top
        return t, prio, seq, job, kind

    def _fire(self, job: _Job, kind: str, t: float) -> None:
        if kind == "release":
            self._release_nodes(job)
        elif kind == "running":
            self._begin_running(job, t)
        elif kind == "end":
            assert job.planned_end is not None
            self._end_by_plan(job, t, job.planned_end[1])
        elif kind == "pull-failed":
            ev = self._evidence(
                job,
                "ImagePullBackOff",
                f"{job.image_error}; gave up after {self.settings.image_pull_grace:g} s",
                t,
            )
            self._finish(job, t, Outcome(State.FAILED, Cause.IMAGE_PULL, (ev,)), linger=0.0)
        elif kind == "timeout":
            limit = job.spec.time_limit
            ev = self._evidence(job, "DeadlineExceeded", f"time limit of {limit} s exceeded", t)
            self._finish(job, t, Outcome(State.FAILED, Cause.TIMEOUT, (ev,)), linger=self._linger(job, t))

    def _notify(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    async def wait_for_change(self, *, seen: int | None = None) -> None:
        """Sleep on the clock until the next scheduled change, or until someone acts on the cluster.
        With ``seen``, return at once if the change log has moved past it."""
        loop = asyncio.get_running_loop()
        if self._wake_loop is not loop:  # a cluster shared by name may outlive an event loop
            self._wake, self._wake_loop = asyncio.Event(), loop
        wake = self._wake
        if seen is not None and self._log_seq != seen:
            return
        nxt = self.next_change_time()
        if nxt is None:
            await wake.wait()
            return
        delay = nxt - self.clock.now()
        if delay <= 0:
            await asyncio.sleep(0)
            return
        sleeper = asyncio.ensure_future(self.clock.sleep(delay))
        waiter = asyncio.ensure_future(wake.wait())
        try:
            await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            waiter.cancel()

    # --- capacity -------------------------------------------------------------------------------

    def _admit(self, t: float) -> None:
        while self._queue:
            job = self._jobs[self._queue[0][1]]
            if job.nodes or len(self._free) < job.spec.nodes:
                return  # strict FIFO: the head waits, and so does everyone behind it
            self._queue.pop(0)
            self._start_compute(job, t)

    def _start_compute(self, job: _Job, t: float) -> None:
        for other in self._incarnations.get(job.identity.job_id, []):
            if other is not job and other.nodes:
                self.overlaps.append(Overlap(other.identity, job.identity, t))
        job.nodes = tuple(self._free[: job.spec.nodes])
        del self._free[: job.spec.nodes]
        job.compute_until = None
        job.phase, job.since = Phase.STARTING, t
        job.running_at = t + self.settings.start_delay
        job.deadline = t + job.spec.time_limit if job.spec.time_limit is not None else None
        image = job.spec.extensions.get(Image)
        job.image_error = image_problem(image.ref) if image is not None else None
        job.pull_fail_at = t + self.settings.image_pull_grace if job.image_error else None
        job.plans = tuple(plan_rank(job.steps, rank, job.env) for rank in range(job.spec.nodes))
        job.planned_end = None
        self._touch(job)

    def _release_nodes(self, job: _Job) -> None:
        for node in job.nodes:
            bisect.insort(self._free, node, key=lambda n: int(n.rsplit("-", 1)[1]))
        job.nodes = ()
        job.compute_until = None
        self._touch(job)

    def _linger(self, job: _Job, t: float) -> float:
        """How long the compute stays after being told to stop at ``t``."""
        if not job.nodes:
            return 0.0
        if job.forced_linger is not None:
            return job.forced_linger
        if job.phase is not Phase.RUNNING:
            return self.settings.cessation_delay
        # Each rank's last slow-stop reached replaces cessationDelay for it; the slowest rank decides.
        ran = t - job.running_at
        lingers = []
        for plan in job.plans:
            reached = [s for at, s in plan.slow_stops if at <= ran]
            lingers.append(reached[-1] if reached else self.settings.cessation_delay)
        return max(lingers, default=self.settings.cessation_delay)

    # --- lifecycle ------------------------------------------------------------------------------

    def _begin_running(self, job: _Job, t: float) -> None:
        job.phase, job.since = Phase.RUNNING, t
        self._replan(job)
        self._touch(job)

    def _replan(self, job: _Job) -> None:
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

    def _end_by_plan(self, job: _Job, t: float, rank: int) -> None:
        plan = job.plans[rank]
        if plan.verb == "exit" and plan.code == 0:
            ev = self._evidence(job, "Completed", "every node exited with code 0", t, exit_code=0)
            self._finish(job, t, Outcome(State.SUCCEEDED, Cause.NONE, (ev,)), linger=0.0)
        else:
            self._fail(job, t, rank, plan.verb, plan.code)

    def _fail(self, job: _Job, t: float, rank: int, verb: str, code: int = 0) -> None:
        node = job.nodes[rank] if rank < len(job.nodes) else None
        where = f"node {rank} ({node})"
        output = self._tail(job, rank, t)
        if verb == "exit":
            ev = self._evidence(
                job, "Error", f"{where} exited with code {code}", t, exit_code=code, rank=rank, output=output
            )
            outcome = Outcome(State.FAILED, Cause.EXIT_CODE, (ev,))
        elif verb == "oom":
            ev = self._evidence(
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
            ev = self._evidence(
                job, "Preempted", f"{where} was preempted by the scheduler", t, rank=rank, output=output
            )
            outcome = Outcome(State.FAILED, Cause.PREEMPTED, (ev,))
        elif verb == "evict":
            ev = self._evidence(job, "Evicted", f"{where} was evicted", t, rank=rank, output=output)
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
        if job.phase is Phase.RUNNING:
            # What real controllers show for a moment: a pod has failed, the job's Failed condition is not
            # written yet, so the job is not all running: "starting", with the pod's reason.
            self._append(
                Observation(
                    job.handle, Outcome(State.STARTING, outcome.cause, outcome.evidence), t, Compute.PRESENT
                )
            )
        # Its pods terminate with their grace period, as a stop's do.
        self._finish(job, t, outcome, linger=self._linger(job, t))

    def _tail(self, job: _Job, rank: int, t: float) -> tuple[str, ...]:
        if job.phase is not Phase.RUNNING or rank >= len(job.plans):
            return ()
        ran = t - job.running_at
        return tuple(text for at, text in job.plans[rank].lines if at <= ran)[-OUTPUT_TAIL:]

    def _finish(self, job: _Job, t: float, outcome: Outcome, *, linger: float) -> None:
        if job.phase is Phase.QUEUED:
            self._dequeue(job)
        job.phase, job.since, job.outcome = Phase.DONE, t, outcome
        job.planned_end = None
        if job.nodes and job.compute_until is None:  # compute already going away keeps its own pace
            job.compute_until = t + linger
            if linger <= 0:
                self._release_nodes(job)
        self._touch(job)

    def _dequeue(self, job: _Job) -> None:
        self._queue = [(s, n) for s, n in self._queue if n != job.name]

    def _enqueue(self, job: _Job, t: float) -> None:
        job.phase, job.since = Phase.QUEUED, t
        bisect.insort(self._queue, (job.seq, job.name))
        self._touch(job)

    # --- outcomes and the change log -------------------------------------------------------------

    def _evidence(
        self,
        job: _Job,
        reason: str,
        message: str,
        t: float,
        *,
        exit_code: int | None = None,
        rank: int | None = None,
        output: tuple[str, ...] = (),
    ) -> Evidence:
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

    def outcome_of(self, job: _Job) -> Outcome:
        """The folded outcome of a job as the cluster shows it now (pure: reads, changes nothing)."""
        if job.outcome is not None:
            return job.outcome
        t = job.since
        if job.phase is Phase.QUEUED:
            message = f"waiting for {job.spec.nodes} free node(s) of {self.settings.nodes}"
            return Outcome(
                State.QUEUED, Cause.NO_CAPACITY, (self._evidence(job, "InsufficientNodes", message, t),)
            )
        if job.phase is Phase.HELD:
            ev = self._evidence(job, "Held", "held by dispatch; release it to run", t)
            return Outcome(State.HELD, Cause.NONE, (ev,))
        where = ", ".join(job.nodes)
        if job.phase is Phase.STARTING:
            if job.image_error:
                ev = self._evidence(job, "ErrImagePull", job.image_error, t)
                return Outcome(State.STARTING, Cause.IMAGE_PULL, (ev,))
            return Outcome(
                State.STARTING, Cause.NONE, (self._evidence(job, "Starting", f"starting on {where}", t),)
            )
        return Outcome(State.RUNNING, Cause.NONE, (self._evidence(job, "Running", f"running on {where}", t),))

    def _touch(self, job: _Job) -> None:
        """Record that ``job`` changed: its outcome is compared at the next flush, its timers renewed."""
        self._dirty[job.name] = job
        job.version += 1
        for t, prio, kind in self._events(job):
            heapq.heappush(self._timers, (t, prio, job.seq, job.version, kind, job))
        if job.nodes or job.phase in (Phase.STARTING, Phase.RUNNING):
            self._active_jobs[job.name] = job
        else:
            self._active_jobs.pop(job.name, None)

    def _flush(self, t: float) -> None:
        for job in sorted(self._dirty.values(), key=lambda j: j.seq):
            now = (self.outcome_of(job), _compute(job))
            if now != job.emitted:
                job.emitted = now
                self._append(Observation(job.handle, now[0], t, now[1]))
        self._dirty.clear()

    def _append(self, reading: Item) -> None:
        self._log_seq += 1
        self._log.append(reading)

    # --- operations (the backend checks read-only and the spec before calling these) --------------

    def lookup(self, handle: Handle) -> _Job | None:
        job = self._jobs.get(handle.ref)
        if job is not None and not job.identity.same_incarnation(handle.identity):
            raise ConflictError(
                f"{handle.ref!r} is incarnation {job.identity} of a job, not {handle.identity}; "
                "the handle does not belong to this cluster's object"
            )
        return job

    def require(self, handle: Handle) -> _Job:
        job = self.lookup(handle)
        if job is None:
            raise NotFoundError(
                f"no memory job {handle.ref!r} (incarnation {handle.identity}) on this cluster"
            )
        return job

    def create(
        self,
        name: str,
        handle: Handle,
        spec: JobSpec,
        steps: tuple[Step, ...],
        *,
        held: bool,
        store: str = "",
    ) -> Handle:
        """Create the incarnation, or return the handle of the one already under ``name``. ``store`` is
        the identity of the store whose record it is (see :meth:`store_of`)."""
        now = self.sync()
        existing = self._jobs.get(name)
        if existing is not None:
            if existing.identity.same_incarnation(handle.identity) and self.store_of(name) == store:
                return existing.handle
            raise ConflictError(
                f"memory job {name!r} already exists for {existing.identity}, not {handle.identity}"
            )
        self._seq += 1
        self._vanished.pop(name, None)
        job = _Job(
            seq=self._seq,
            name=name,
            handle=handle,
            spec=spec,
            env=job_env(spec, handle.identity),
            steps=steps,
            held_at_create=held,
            created_at=now,
            phase=Phase.HELD if held else Phase.QUEUED,
            since=now,
        )
        self._jobs[name] = job
        self._stores[name] = store
        self._incarnations.setdefault(handle.identity.job_id, []).append(job)
        if held:
            job.hold_token = self._new_token()
            self._touch(job)
        else:
            self._enqueue(job, now)
        self._settle(now)
        return handle

    def stop(self, handle: Handle) -> None:
        now = self.sync()
        job = self.lookup(handle)
        if job is not None and not job.live and job.nodes and job.compute_until is not None:
            # Compute left behind by an ended job (a slow-stop: pods that would linger): a stop deletes
            # it, and it goes within the ordinary cessation delay.
            until = now + self.settings.cessation_delay
            if job.compute_until > until:
                job.compute_until = until
                self._touch(job)
                self._settle(now)
            return
        if job is None or not job.live:
            return
        ev = self._evidence(job, "Cancelled", "stopped by dispatch", now)
        self._finish(
            job, now, Outcome(State.CANCELLED, Cause.CANCELLED, (ev,)), linger=self._linger(job, now)
        )
        self._settle(now)

    def hold(self, handle: Handle) -> str:
        now = self.sync()
        job = self.require(handle)
        if job.phase is Phase.HELD:
            assert job.hold_token is not None
            return job.hold_token
        if not job.live:
            raise ConflictError(
                f"memory job {job.name!r} already ended ({self.outcome_of(job)}); nothing to hold"
            )
        if job.phase is Phase.QUEUED:
            self._dequeue(job)
        elif job.nodes:  # a held running job gives its nodes back, like a suspended one
            linger = self._linger(job, now)
            job.compute_until = now + linger
            if linger <= 0:
                self._release_nodes(job)
        job.phase, job.since, job.planned_end = Phase.HELD, now, None
        job.hold_token = self._new_token()
        self._touch(job)
        self._settle(now)
        return job.hold_token

    def release(self, handle: Handle, token: str) -> None:
        now = self.sync()
        job = self.require(handle)
        if job.phase is not Phase.HELD or job.hold_token != token:
            shown = job.hold_token if job.phase is Phase.HELD else "no hold"
            raise ConflictError(
                f"stale hold on memory job {job.name!r}: the token does not match what the cluster shows "
                f"({'a different hold' if shown != 'no hold' else 'no hold'}); hold it again to get a fresh token"
            )
        job.hold_token = None
        self._enqueue(job, now)
        self._settle(now)

    def inject(
        self, handle: Handle, verb: str, *, rank: int = 0, code: int = 0, seconds: float = 0.0
    ) -> None:
        """Apply a cluster event to a job now (see :meth:`MemoryBackend.inject`)."""
        now = self.sync()
        job = self.require(handle)
        if verb == "slow-stop":
            job.forced_linger = seconds
            self._settle(now)
            return
        if job.phase not in (Phase.STARTING, Phase.RUNNING):
            raise ConflictError(
                f"memory job {job.name!r} is {self.outcome_of(job).state}, not starting or running: "
                f"there is no compute for '{verb}' to happen to"
            )
        if not 0 <= rank < job.spec.nodes:
            raise InvalidError(f"the job has ranks 0..{job.spec.nodes - 1}, got {rank}", path="rank")
        if verb == "hang":
            job.forced_hang = True
            job.planned_end = None
            self._touch(job)
        elif verb == "exit" and code == 0:
            ev = self._evidence(job, "Completed", "every node exited with code 0", now, exit_code=0)
            self._finish(job, now, Outcome(State.SUCCEEDED, Cause.NONE, (ev,)), linger=0.0)
        elif verb == "lose-node":
            lost = job.nodes[rank]
            for other in list(self._active_jobs.values()):
                if other.live and lost in other.nodes and other.phase in (Phase.STARTING, Phase.RUNNING):
                    self._fail(other, now, other.nodes.index(lost), "lose-node")
        else:
            self._fail(job, now, rank, verb, code)
        self._settle(now)

    def vanish(self, handle: Handle) -> None:
        """Remove the job's object as if someone else deleted it (observe then reports ``lost``)."""
        now = self.sync()
        job = self.require(handle)
        if job.phase is Phase.QUEUED:
            self._dequeue(job)
        if job.nodes:
            self._release_nodes(job)
        del self._jobs[job.name]
        self._active_jobs.pop(job.name, None)
        self._incarnations[job.identity.job_id].remove(job)
        self._dirty.pop(job.name, None)
        gone = Absent(job.handle, now, (_gone_evidence(job.name, now),))
        self._vanished[job.name] = gone
        self._append(gone)
        self._settle(now)

    def _settle(self, now: float) -> None:
        self._admit(now)
        self._flush(now)
        self._notify()

    def _new_token(self) -> str:
        self._tokens += 1
        return f"hold-{self._tokens}"

    # --- reads ----------------------------------------------------------------------------------

    def store_of(self, name: str) -> str:
        """The identity of the store that created job ``name`` (``""``: none given)."""
        return self._stores.get(name, "")

    def outage(self, seconds: float, how: str = "down") -> None:
        """Make the cluster unreachable for ``seconds`` of its clock: ``down`` (no answer), ``partial``
        (a listing that leaves jobs out) or ``errors`` (an empty answer carrying an errors list). Its
        jobs go on meanwhile; only the answers fail. ``seconds`` 0 ends an outage."""
        if how not in OUTAGES:
            raise InvalidError(f"expected one of {', '.join(OUTAGES)}, got {how!r}", path="how")
        now = self.sync()
        self._outage = (now + seconds, how) if seconds > 0 else None

    def answering(self) -> str | None:
        """How the cluster fails to answer now (see :meth:`outage`), or ``None`` when it answers."""
        if self._outage is None:
            return None
        until, how = self._outage
        if self.clock.now() >= until:
            self._outage = None
            return None
        return how

    def _answer(self) -> None:
        """Refuse a read while the cluster does not answer; a partial answer or one that carries errors
        is refused too, as an adapter must (SPEC §5: it is *unreachable*, never "gone")."""
        how = self.answering()
        if how == "down":
            raise UnavailableError("the memory cluster does not answer (outage)")
        if how == "errors":
            raise UnavailableError(
                'the memory cluster answered "no jobs" with errors: controller unavailable'
            )
        if how == "partial":
            raise UnavailableError("the memory cluster's answer is partial (some nodes did not report)")

    def observe(self, handle: Handle) -> Item:
        self._answer()
        now = self.sync()
        job = self.lookup(handle)
        if job is None:
            gone = self._vanished.get(handle.ref)
            return gone if gone is not None else Absent(handle, now, (_gone_evidence(handle.ref, now),))
        return Observation(job.handle, self.outcome_of(job), now, _compute(job))

    def observations(self) -> list[Observation]:
        self._answer()
        now = self.sync()
        return [
            Observation(j.handle, self.outcome_of(j), now, _compute(j))
            for j in sorted(self._jobs.values(), key=lambda j: j.seq)
        ]

    def ceased(self, handle: Handle) -> bool:
        self.sync()
        job = self.lookup(handle)
        return job is None or (not job.live and not job.nodes)

    async def wait_ceased(self, handle: Handle) -> None:
        while not self.ceased(handle):
            await self.wait_for_change()

    def objects(self) -> list[dict[str, Any]]:
        """The native object of every job, as :meth:`MemoryBackend.prepare` shows them."""
        self.sync()
        return [
            native_object(j.name, j.spec, j.identity, held=j.held_at_create, status=self._status(j))
            for j in sorted(self._jobs.values(), key=lambda j: j.seq)
        ]

    def _status(self, job: _Job) -> dict[str, Any]:
        outcome = self.outcome_of(job)
        status: dict[str, Any] = {
            "state": outcome.state.value,
            "cause": outcome.cause.value,
            "nodes": list(job.nodes),
        }
        if job.hold_token is not None:
            status["hold"] = job.hold_token
        return status

    def changes(self, position: int | None) -> tuple[list[Item], int]:
        """The readings logged after ``position`` and the position after them, as an API server's watch
        history serves them; with ``None``, or a position older than the ``watchHistory`` kept, the
        current reading of every job instead (a relist). Unreachable during an outage."""
        self._answer()
        now = self.sync()
        oldest = self._log_seq - len(self._log)  # the last sequence number no longer kept
        if position is None or position < oldest or position > self._log_seq:
            current: list[Item] = [
                Observation(j.handle, self.outcome_of(j), now, _compute(j))
                for j in sorted(self._jobs.values(), key=lambda j: j.seq)
            ]
            return current + list(self._vanished.values()), self._log_seq
        return list(self._log)[position - oldest :], self._log_seq

    @property
    def position(self) -> int:
        """The sequence number of the newest logged reading."""
        return self._log_seq


def _compute(job: _Job) -> Compute:
    return Compute.PRESENT if job.nodes else Compute.GONE


def _gone_evidence(name: str, t: float) -> Evidence:
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


@dataclass
class _Registry:
    clusters: dict[str, MemoryCluster] = field(default_factory=dict)


_SHARED = _Registry()


def shared_cluster(settings: MemorySettings, clock: Clock) -> MemoryCluster:
    """The process-wide cluster named ``settings.cluster``, created on first use."""
    assert settings.cluster is not None
    existing = _SHARED.clusters.get(settings.cluster)
    if existing is None:
        existing = MemoryCluster(settings, clock=clock)
        _SHARED.clusters[settings.cluster] = existing
    elif existing.settings != settings:
        raise ConflictError(
            f"memory cluster {settings.cluster!r} is already open in this process with other settings "
            f"({json.dumps(existing.settings.to_json(), sort_keys=True)}); use the same settings or another name"
        )
    return existing
