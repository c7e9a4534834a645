"""The memory cluster's own motion: :class:`Timeline` — time, capacity, the jobs' lifecycles, the change log.

There are no background tasks: every scheduled change of a job (starting to run, ending, timing out, its
compute going away) is a timer, and :meth:`Timeline.sync` fires the timers due by the clock's now in
time order, admitting queued jobs (strict FIFO) as nodes free. Every change of a job's reading (its
outcome, and whether its compute is still there) is appended to a bounded change log.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from dispatch.clock import Clock
from dispatch.memory.jobs import (
    Job,
    Phase,
    compute,
    events,
    evidence,
    failure,
    image_problem,
    linger,
    outcome_of,
    replan,
)
from dispatch.memory.script import plan_rank
from dispatch.memory.settings import MemorySettings
from dispatch.model import Absent, Cause, Compute, Identity, Image, Observation, Outcome, State

__all__ = ["Item", "Overlap", "Timeline"]

Item = Observation | Absent
"""A reading the cluster's change log holds."""


@dataclass(frozen=True, slots=True)
class Overlap:
    """Two incarnations of one job had compute at the same time (what cessation exists to prevent)."""

    running: Identity
    started: Identity
    at: float


class Timeline:
    """The jobs of one memory cluster on its ``clock``, its nodes and queue, and its change log (see the
    module docstring)."""

    def __init__(self, settings: MemorySettings, clock: Clock) -> None:
        self.settings = settings
        self.clock = clock
        self._time = clock.now()
        self.jobs: dict[str, Job] = {}
        self.incarnations: dict[str, list[Job]] = {}  # by job id
        self._queue: list[tuple[int, str]] = []  # (seq, name), creation order: strict FIFO
        self._free = [f"node-{i}" for i in range(settings.nodes)]
        self.log: deque[Item] = deque(maxlen=settings.watch_history)
        self.log_seq = 0  # sequence number of the newest change
        self.dirty: dict[str, Job] = {}
        self.active: dict[str, Job] = {}  # starting, running, or with compute
        # (time, priority, job seq, job version, kind, job): stale once the job's version moved on
        self._timers: list[tuple[float, int, int, int, str, Job]] = []
        self._wake = asyncio.Event()
        self._wake_loop: asyncio.AbstractEventLoop | None = None
        self.overlaps: list[Overlap] = []
        """Every time an incarnation got compute while another incarnation of the same job still had
        some (a supervisor that does not wait for cessation shows up here)."""

    def next_change(self) -> float | None:
        """When the next scheduled change happens (``None``: nothing will change until someone acts)."""
        top = self._peek()
        return top[0] if top is not None else None

    async def wait(self, next_time: Callable[[], float | None], *, seen: int | None = None) -> None:
        """Sleep on the clock until ``next_time()``, or until someone acts on the cluster. With ``seen``,
        return at once if the change log has moved past it."""
        loop = asyncio.get_running_loop()
        if self._wake_loop is not loop:  # a cluster shared by name may outlive an event loop
            self._wake, self._wake_loop = asyncio.Event(), loop
        wake = self._wake
        if seen is not None and self.log_seq != seen:
            return
        nxt = next_time()
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

    def add(self, job: Job) -> None:
        """A job created: it joins the jobs (and its job id's incarnations)."""
        self.jobs[job.name] = job
        self.incarnations.setdefault(job.handle.identity.job_id, []).append(job)

    def remove(self, job: Job) -> None:
        """A job deleted behind dispatch's back: out of the queue, its nodes freed, forgotten."""
        if job.phase is Phase.QUEUED:
            self.dequeue(job)
        if job.nodes:
            self.release_nodes(job)
        del self.jobs[job.name]
        self.active.pop(job.name, None)
        self.incarnations[job.identity.job_id].remove(job)
        self.dirty.pop(job.name, None)

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
            self.notify()
        return now

    def _peek(self) -> tuple[float, int, int, int, str, Job] | None:
        """The earliest timer still valid (timers of a job are replaced whenever it changes)."""
        while self._timers:
            top = self._timers[0]
            if top[5].version == top[3] and self.jobs.get(top[5].name) is top[5]:
                return top
            heapq.heappop(self._timers)
        return None

    def _next_due(self, now: float) -> tuple[float, int, int, Job, str] | None:
        top = self._peek()
        if top is None or top[0] > now:
            return None
        heapq.heappop(self._timers)
        t, prio, seq, _, kind, job = top
        return t, prio, seq, job, kind

    def _fire(self, job: Job, kind: str, t: float) -> None:
        if kind == "release":
            self.release_nodes(job)
        elif kind == "running":
            self._begin_running(job, t)
        elif kind == "end":
            assert job.planned_end is not None
            self._end_by_plan(job, t, job.planned_end[1])
        elif kind == "pull-failed":
            ev = evidence(
                job,
                "ImagePullBackOff",
                f"{job.image_error}; gave up after {self.settings.image_pull_grace:g} s",
                t,
            )
            self.finish(job, t, Outcome(State.FAILED, Cause.IMAGE_PULL, (ev,)), linger=0.0)
        elif kind == "timeout":
            limit = job.spec.time_limit
            ev = evidence(job, "DeadlineExceeded", f"time limit of {limit} s exceeded", t)
            self.finish(job, t, Outcome(State.FAILED, Cause.TIMEOUT, (ev,)), linger=self.linger(job, t))

    def notify(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    def _admit(self, t: float) -> None:
        while self._queue:
            job = self.jobs[self._queue[0][1]]
            if job.nodes or len(self._free) < job.spec.nodes:
                return  # strict FIFO: the head waits, and so does everyone behind it
            self._queue.pop(0)
            self._start_compute(job, t)

    def _start_compute(self, job: Job, t: float) -> None:
        for other in self.incarnations.get(job.identity.job_id, []):
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
        self.touch(job)

    def release_nodes(self, job: Job) -> None:
        for node in job.nodes:
            bisect.insort(self._free, node, key=lambda n: int(n.rsplit("-", 1)[1]))
        job.nodes = ()
        job.compute_until = None
        self.touch(job)

    def _begin_running(self, job: Job, t: float) -> None:
        job.phase, job.since = Phase.RUNNING, t
        replan(job)
        self.touch(job)

    def _end_by_plan(self, job: Job, t: float, rank: int) -> None:
        plan = job.plans[rank]
        if plan.verb == "exit" and plan.code == 0:
            ev = evidence(job, "Completed", "every node exited with code 0", t, exit_code=0)
            self.finish(job, t, Outcome(State.SUCCEEDED, Cause.NONE, (ev,)), linger=0.0)
        else:
            self.fail(job, t, rank, plan.verb, plan.code)

    def fail(self, job: Job, t: float, rank: int, verb: str, code: int = 0) -> None:
        outcome = failure(job, t, rank, verb, code)
        if job.phase is Phase.RUNNING:
            # What real controllers show for a moment: a pod has failed, the job's Failed condition is not
            # written yet, so the job is not all running: "starting", with the pod's reason.
            self.append(
                Observation(
                    job.handle, Outcome(State.STARTING, outcome.cause, outcome.evidence), t, Compute.PRESENT
                )
            )
        # Its pods terminate with their grace period, as a stop's do.
        self.finish(job, t, outcome, linger=self.linger(job, t))

    def finish(self, job: Job, t: float, outcome: Outcome, *, linger: float) -> None:
        if job.phase is Phase.QUEUED:
            self.dequeue(job)
        job.phase, job.since, job.outcome = Phase.DONE, t, outcome
        job.planned_end = None
        if job.nodes and job.compute_until is None:  # compute already going away keeps its own pace
            job.compute_until = t + linger
            if linger <= 0:
                self.release_nodes(job)
        self.touch(job)

    def dequeue(self, job: Job) -> None:
        self._queue = [(s, n) for s, n in self._queue if n != job.name]

    def enqueue(self, job: Job, t: float) -> None:
        job.phase, job.since = Phase.QUEUED, t
        bisect.insort(self._queue, (job.seq, job.name))
        self.touch(job)

    def linger(self, job: Job, t: float) -> float:
        """How long the compute stays after being told to stop at ``t``."""
        return linger(job, t, self.settings.cessation_delay)

    def touch(self, job: Job) -> None:
        """Record that ``job`` changed: its outcome is compared at the next flush, its timers renewed."""
        self.dirty[job.name] = job
        job.version += 1
        for t, prio, kind in events(job):
            heapq.heappush(self._timers, (t, prio, job.seq, job.version, kind, job))
        if job.nodes or job.phase in (Phase.STARTING, Phase.RUNNING):
            self.active[job.name] = job
        else:
            self.active.pop(job.name, None)

    def _flush(self, t: float) -> None:
        for job in sorted(self.dirty.values(), key=lambda j: j.seq):
            now = (outcome_of(job, self.settings.nodes), compute(job))
            if now != job.emitted:
                job.emitted = now
                self.append(Observation(job.handle, now[0], t, now[1]))
        self.dirty.clear()

    def append(self, reading: Item) -> None:
        self.log_seq += 1
        self.log.append(reading)

    def settle(self, now: float) -> None:
        self._admit(now)
        self._flush(now)
        self.notify()
