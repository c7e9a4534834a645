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

Its parts: a job and the rules of its timeline (pure) in :mod:`dispatch.memory.jobs`; the cluster's own
motion — time, nodes, queue, lifecycles, the change log — in :mod:`dispatch.memory.timeline`; what is
done to the cluster and what it answers (operations, reads, outages), here.
"""

from __future__ import annotations

import itertools
import json
import random
from dataclasses import dataclass, field
from typing import Any

from dispatch import chance
from dispatch.clock import Clock
from dispatch.errors import ConflictError, InvalidError, NotFoundError, UnavailableError
from dispatch.memory.jobs import (
    API_VERSION,
    KIND_JOB,
    KIND_NODE,
    Job,
    Phase,
    compute,
    evidence,
    gone_evidence,
    image_problem,
    job_env,
    native_object,
    outcome_of,
)
from dispatch.memory.script import Step
from dispatch.memory.settings import MemorySettings
from dispatch.memory.timeline import Item, Overlap, Timeline
from dispatch.model import (
    Absent,
    Cause,
    Handle,
    JobSpec,
    Observation,
    Outcome,
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
    "job_env",
    "native_object",
    "shared_cluster",
]

OUTAGES = ("down", "partial", "errors")
"""How the cluster can fail to answer (:meth:`MemoryCluster.outage`): not at all, with only some of its
jobs, or with an empty answer that carries an errors list (Slurm's JSON with slurmctld down)."""


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
        self.timeline = Timeline(self.settings, self.clock)
        """The cluster's own motion: its jobs, nodes, queue, timers and change log."""
        self._vanished: dict[str, Absent] = {}  # by name: jobs deleted behind dispatch's back
        self._seq = 0
        self._tokens = 0
        self._outage: tuple[float, str] | None = None  # (until, how) the cluster does not answer

    @property
    def overlaps(self) -> list[Overlap]:
        """Every time an incarnation got compute while another incarnation of the same job still had
        some (a supervisor that does not wait for cessation shows up here)."""
        return self.timeline.overlaps

    # --- time -----------------------------------------------------------------------------------

    def sync(self) -> float:
        """Advance the simulation to the clock's now, processing due changes in order. Returns now."""
        return self.timeline.sync()

    def next_change_time(self) -> float | None:
        """When the next scheduled change happens (None: nothing will change until someone acts); the
        end of an outage counts (what could not be read can be read again then)."""
        top = self.timeline.next_change()
        times = [top] if top is not None else []
        if self._outage is not None:
            times.append(self._outage[0])
        return min(times) if times else None

    async def wait_for_change(self, *, seen: int | None = None) -> None:
        """Sleep on the clock until the next scheduled change, or until someone acts on the cluster.
        With ``seen``, return at once if the change log has moved past it."""
        await self.timeline.wait(self.next_change_time, seen=seen)

    def outcome_of(self, job: Job) -> Outcome:
        """The folded outcome of a job as the cluster shows it now (pure: reads, changes nothing)."""
        return outcome_of(job, self.settings.nodes)

    # --- operations (the backend checks read-only and the spec before calling these) --------------

    def lookup(self, handle: Handle) -> Job | None:
        job = self.timeline.jobs.get(handle.ref)
        if job is not None and not job.identity.same_incarnation(handle.identity):
            raise ConflictError(
                f"{handle.ref!r} is incarnation {job.identity} of a job, not {handle.identity}; "
                "the handle does not belong to this cluster's object"
            )
        return job

    def require(self, handle: Handle) -> Job:
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
        self._accept_write()
        now = self.sync()
        existing = self.timeline.jobs.get(name)
        if existing is not None:
            if existing.identity.same_incarnation(handle.identity) and self.store_of(name) == store:
                return existing.handle
            raise ConflictError(
                f"memory job {name!r} already exists for {existing.identity}, not {handle.identity}"
            )
        self._seq += 1
        self._vanished.pop(name, None)
        job = Job(
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
        self.timeline.add(job)
        self._stores[name] = store
        if held:
            job.hold_token = self._new_token()
            self.timeline.touch(job)
        else:
            self.timeline.enqueue(job, now)
        self.timeline.settle(now)
        return handle

    def stop(self, handle: Handle) -> None:
        self._accept_write()
        now = self.sync()
        job = self.lookup(handle)
        if job is not None and not job.live and job.nodes and job.compute_until is not None:
            # Compute left behind by an ended job (a slow-stop: pods that would linger): a stop deletes
            # it, and it goes within the ordinary cessation delay.
            until = now + self.settings.cessation_delay
            if job.compute_until > until:
                job.compute_until = until
                self.timeline.touch(job)
                self.timeline.settle(now)
            return
        if job is None or not job.live:
            return
        ev = evidence(job, "Cancelled", "stopped by dispatch", now)
        self.timeline.finish(
            job, now, Outcome(State.CANCELLED, Cause.CANCELLED, (ev,)), linger=self.timeline.linger(job, now)
        )
        self.timeline.settle(now)

    def hold(self, handle: Handle) -> str:
        self._accept_write()
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
            self.timeline.dequeue(job)
        elif job.nodes:  # a held running job gives its nodes back, like a suspended one
            linger = self.timeline.linger(job, now)
            job.compute_until = now + linger
            if linger <= 0:
                self.timeline.release_nodes(job)
        job.phase, job.since, job.planned_end = Phase.HELD, now, None
        job.hold_token = self._new_token()
        self.timeline.touch(job)
        self.timeline.settle(now)
        return job.hold_token

    def release(self, handle: Handle, token: str) -> None:
        self._accept_write()
        now = self.sync()
        job = self.require(handle)
        if job.phase is not Phase.HELD or job.hold_token != token:
            shown = job.hold_token if job.phase is Phase.HELD else "no hold"
            raise ConflictError(
                f"stale hold on memory job {job.name!r}: the token does not match what the cluster shows "
                f"({'a different hold' if shown != 'no hold' else 'no hold'}); hold it again to get a fresh token"
            )
        job.hold_token = None
        self.timeline.enqueue(job, now)
        self.timeline.settle(now)

    def inject(
        self, handle: Handle, verb: str, *, rank: int = 0, code: int = 0, seconds: float = 0.0
    ) -> None:
        """Apply a cluster event to a job now (see :meth:`MemoryBackend.inject`)."""
        now = self.sync()
        job = self.require(handle)
        if verb == "slow-stop":
            job.forced_linger = seconds
            self.timeline.settle(now)
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
            self.timeline.touch(job)
        elif verb == "exit" and code == 0:
            ev = evidence(job, "Completed", "every node exited with code 0", now, exit_code=0)
            self.timeline.finish(job, now, Outcome(State.SUCCEEDED, Cause.NONE, (ev,)), linger=0.0)
        elif verb == "lose-node":
            lost = job.nodes[rank]
            for other in list(self.timeline.active.values()):
                if other.live and lost in other.nodes and other.phase in (Phase.STARTING, Phase.RUNNING):
                    self.timeline.fail(other, now, other.nodes.index(lost), "lose-node")
        else:
            self.timeline.fail(job, now, rank, verb, code)
        self.timeline.settle(now)

    def vanish(self, handle: Handle) -> None:
        """Remove the job's object as if someone else deleted it (observe then reports ``lost``)."""
        now = self.sync()
        job = self.require(handle)
        self.timeline.remove(job)
        gone = Absent(job.handle, now, (gone_evidence(job.name, now),))
        self._vanished[job.name] = gone
        self.timeline.append(gone)
        self.timeline.settle(now)

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

    def check_answering(self) -> None:
        """``UnavailableError`` while the cluster does not answer (see :meth:`outage`): what a read of
        it meets."""
        self._answer()

    def _accept_write(self) -> None:
        """Refuse a write while the cluster does not answer at all, or its controller is down: a real
        one refuses the connection (Kubernetes' API server down) or the command (``sbatch``/``scancel``
        with slurmctld down), and nothing is done. A partial outage (some nodes do not report) still
        takes writes."""
        how = self.answering()
        if how in ("down", "errors"):
            raise UnavailableError(f"the memory cluster does not answer ({how} outage): nothing was sent")

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
            return gone if gone is not None else Absent(handle, now, (gone_evidence(handle.ref, now),))
        return Observation(job.handle, self.outcome_of(job), now, compute(job))

    def observations(self) -> list[Observation]:
        self._answer()
        now = self.sync()
        return [
            Observation(j.handle, self.outcome_of(j), now, compute(j))
            for j in sorted(self.timeline.jobs.values(), key=lambda j: j.seq)
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
            for j in sorted(self.timeline.jobs.values(), key=lambda j: j.seq)
        ]

    def _status(self, job: Job) -> dict[str, Any]:
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
        oldest = self.timeline.log_seq - len(self.timeline.log)  # the last sequence number no longer kept
        if position is None or position < oldest or position > self.timeline.log_seq:
            current: list[Item] = [
                Observation(j.handle, self.outcome_of(j), now, compute(j))
                for j in sorted(self.timeline.jobs.values(), key=lambda j: j.seq)
            ]
            return current + list(self._vanished.values()), self.timeline.log_seq
        # The newest entries, walked from the end: copying the whole log (up to ``watchHistory``, 400,000
        # in the 100,000-job benchmark) to slice its tail cost milliseconds per change.
        log = self.timeline.log
        newer = list(itertools.islice(reversed(log), self.timeline.log_seq - position))
        newer.reverse()
        return newer, self.timeline.log_seq

    @property
    def position(self) -> int:
        """The sequence number of the newest logged reading."""
        return self.timeline.log_seq


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
