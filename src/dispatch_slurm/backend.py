"""The Slurm backend: every protocol of the SPI over Slurm's commands (run through a transport).

Reads go through one ``squeue --json --states=all`` (22.05 lists every job whatever the filter, 24.11 on
apply squeue's default state filter unless told ``--states=all``: dispatch's jobs are picked out by
their comment), then text ``sacct`` for jobs that left the queue — one call for all of them. Every answer
is read by :mod:`~dispatch_slurm.reader` in the dialect of the version opening read; a command that did
not answer (controller down, munge down, ssh cut, a timeout, an answer carrying ``errors``) raises
``UnavailableError`` from the reading methods (:mod:`~dispatch_slurm.answers`): it never reads as "the
job is gone". Decisions are the pure modules' (:mod:`~dispatch_slurm.causes`,
:mod:`~dispatch_slurm.script`, :mod:`~dispatch_slurm.naming`).

A start is one round trip: the job's directory is made and the script submitted by one ``sh -c``. The
directory doubles as the record of an earlier attempt: ``mkdir`` of it succeeds for exactly one start of
an identity, so only a start that finds it made already (an earlier start whose outcome is unknown, or
one that crashed before its handle was recorded) looks the identity up before submitting.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from dispatch.backend import HoldToken, Prepared
from dispatch.config import AdapterConfig
from dispatch.errors import (
    ConflictError,
    InvalidError,
    NotFoundError,
    OutcomeUnknownError,
    ReadOnlyError,
    UnavailableError,
    UnsupportedError,
)
from dispatch.model import (
    Capabilities,
    Change,
    Handle,
    Identity,
    JobSpec,
    Limits,
    Mode,
    Observation,
    Share,
)
from dispatch_slurm import naming
from dispatch_slurm.answers import Failure, answer, failure_of
from dispatch_slurm.causes import Facts, classify
from dispatch_slurm.errors import StaleHoldError
from dispatch_slurm.preflight import ClusterInfo, read_cluster
from dispatch_slurm.queries import Queries
from dispatch_slurm.reader import SlurmJob
from dispatch_slurm.script import (
    ACCEPTED_EXTENSIONS,
    CANCEL_FILE,
    build_request,
    job_dir,
    node_output,
    refusals,
    request_of,
)
from dispatch_slurm.settings import HOLD_BASE, Settings, parse_settings
from dispatch_slurm.transport import CommandLostError, LocalTransport, Result, SshTransport, open_transport

__all__ = ["NAME", "SlurmBackend", "factory", "open_backend"]

_log = logging.getLogger(__name__)

NAME = "slurm"
REQUEUE_SETTLE = 30.0
"""Seconds a release waits for a held (requeued) running job to leave COMPLETING for PENDING."""
_SUBMIT = (
    'if mkdir -- "$1" 2>/dev/null; then exec sbatch --parsable; fi; '
    '[ -d "$1" ] && exit 75; '
    'mkdir -p -- "${1%/*}" && mkdir -- "$1" || exit 74; '
    "exec sbatch --parsable"
)
"""One round trip for a start: make the job's directory, then submit the script (stdin) — or say the
directory was there already (75: an earlier start of this identity) or could not be made (74)."""
_EXISTED, _NO_DIRECTORY = 75, 74
_HISTORY = 10_000
_ids = itertools.count(1)
_CHECK_IDENTITY = Identity("dispatch-capabilities-check")


def _hold_token(job: SlurmJob) -> str:
    """The hold token a held job carries: its id and the start time Slurm shows for it."""
    return f"{job.job_id}@{job.eligible_time}"


def _handle(identity: Identity, ref: str, cluster: str) -> Handle:
    return Handle(NAME, identity, ref, cluster=cluster)


class _Poller:
    """One ``squeue --json`` per poll interval for every watcher of this backend: the changes it saw,
    numbered, kept for resuming."""

    def __init__(self, backend: SlurmBackend) -> None:
        self.backend = backend
        self.id = f"p{next(_ids)}"
        self.seq = 0
        self.polls = 0
        self.last: dict[str, Observation] = {}
        self.history: list[tuple[int, Change]] = []
        self.cond = asyncio.Condition()
        self.watchers = 0
        self.task: asyncio.Task[None] | None = None
        self.error: BaseException | None = None

    def cursor(self, seq: int) -> str:
        return f"{self.id}:{seq}"

    def start(self) -> None:
        if self.task is None or self.task.done():
            self.task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        while True:
            try:
                await self.poll()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a failed poll is retried; watchers see the next one
                self.error = exc
            await asyncio.sleep(float(self.backend.settings.poll_interval))

    async def poll(self) -> None:
        self.polls += 1
        live = {k: o.handle for k, o in self.last.items() if not o.outcome.terminal}  # ended: read once
        observations = await self.backend._observe_all(live)
        await self.offer(observations)

    async def offer(self, observations: list[Observation]) -> None:
        """Emit each observation that changes its incarnation's outcome. ``observe`` offers its answers
        too: a state it saw between two polls is a transition the watch must not miss. An observation
        older than the last one kept for its incarnation is stale and dropped."""
        async with self.cond:
            for obs in observations:
                key = obs.handle.ref
                before = self.last.get(key)
                if before is not None and (before.at > obs.at or before.outcome == obs.outcome):
                    continue
                self.last[key] = obs
                self.seq += 1
                self.history.append((self.seq, Change(obs, self.cursor(self.seq))))
            del self.history[:-_HISTORY]
            self.cond.notify_all()


class SlurmBackend:
    """One opened Slurm cluster."""

    def __init__(
        self,
        settings: Settings,
        transport: LocalTransport | SshTransport,
        info: ClusterInfo,
        *,
        read_only: bool = False,
        store_id: str = "",
    ) -> None:
        self.settings = settings
        self.transport = transport
        self.info = info
        self.read_only = read_only
        self.store_id = store_id
        self.queries = Queries(transport, info)
        self._poller: _Poller | None = None
        self._output_cache: dict[str, tuple[str, ...]] = {}  # Slurm job id → its settled output tail

    # --- identity -------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return NAME

    @property
    def cluster_id(self) -> str:
        """``slurm:<ClusterName>@<controller host>:<port>``, read from the cluster when it was opened."""
        return self.info.cluster_id

    def native_name(self, identity: Identity) -> str:
        return naming.native_name(identity)

    def identity_of(self, obj: Mapping[str, Any]) -> Identity | None:
        return naming.identity_of(obj)

    def _ours(self, job: SlurmJob) -> naming.Marks | None:
        marks = naming.parse_comment(job.comment)
        if marks is None or marks.store != self.store_id:
            return None
        if job.name != naming.native_name(marks.identity):
            return None  # a forged or edited job: not one of ours
        return marks

    # --- capabilities and prepare ---------------------------------------------------------------

    def _refusals(self, spec: JobSpec) -> list[str]:
        reasons = refusals(
            spec,
            self.settings,
            container_plugin=self.info.container_plugin,
            shared_workdir=self.settings.shared_workdir,
        )
        part = self.info.partition(self.settings.partition)
        if part is not None:
            limit = min(part.nodes, part.max_nodes or part.nodes)
            if spec.nodes > limit:
                reasons.append(f"nodes: {spec.nodes} asked, partition {part.name!r} has at most {limit}")
        return reasons

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        if spec is not None:
            # Checking a spec is preparing it for a throwaway identity, with Slurm's own verdict.
            await self._prepare(spec, _CHECK_IDENTITY, held=False, ask_slurm=True)
        part = self.info.partition(self.settings.partition)
        extensions = {"dispatch/SharedCheckpoint"} if self.settings.shared_workdir else set()
        if self.settings.container == "pyxis" and self.info.container_plugin:
            extensions.add("dispatch/Image")
        notes = [f"Slurm {self.info.version}, cluster {self.info.cluster_name}"]
        if not (self.info.accounting or self.info.jobcomp):
            notes.append("no accounting nor completion log: a job is known only while squeue lists it")
        return Capabilities(
            mode=Mode.READ_ONLY if self.read_only else Mode.READ_WRITE,
            holds=True,
            watch=True,
            output=True,
            cessation=True,
            shared_checkpoint=self.settings.shared_workdir,
            queueing=self.settings.requeue == "slurm",
            extensions=frozenset(extensions & ACCEPTED_EXTENSIONS),
            limits=Limits(max_nodes=part.nodes if part else None),
            notes=tuple(notes),
        )

    async def prepare(self, spec: JobSpec, identity: Identity, *, held: bool = False) -> Prepared:
        """Every check, and the script. Slurm's own verdict (``sbatch --test-only``) is asked only of a
        read-only backend, which prepares only to show (``--dry-run``, ``validate``): a submit's
        ``sbatch`` gives the same verdict in the same command (a refusal there fails the start)."""
        return await self._prepare(spec, identity, held=held, ask_slurm=self.read_only)

    async def _prepare(self, spec: JobSpec, identity: Identity, *, held: bool, ask_slurm: bool) -> Prepared:
        if not isinstance(identity, Identity):
            raise InvalidError(f"expected an Identity, got {type(identity).__name__}", path="identity")
        if not isinstance(spec, JobSpec):
            raise InvalidError(f"expected a JobSpec, got {type(spec).__name__}", path="spec")
        reasons = self._refusals(spec)
        if reasons:
            raise UnsupportedError(reasons)
        request = build_request(
            spec,
            identity,
            self.settings,
            workdir=self.info.workdir,
            store_id=self.store_id,
            held=held,
            preempt_partition=self.info.preemptor(self.settings.partition),
        )
        if ask_slurm:
            await self._verdict(request["script"])
        return Prepared(NAME, spec, identity, held, request)

    async def _verdict(self, script: str) -> None:
        """Slurm's verdict on exactly this script, creating nothing (e.g. more memory than a node has)."""
        tested = await self._run(["sbatch", "--test-only"], stdin=script)
        if tested.ok:
            return
        if failure_of(tested) is not Failure.REFUSED:
            raise UnavailableError(f"cannot ask Slurm whether it would run the job: {tested.error()}")
        raise UnsupportedError([f"Slurm would not run it: {tested.error()}"])

    # --- reading --------------------------------------------------------------------------------

    async def _run(self, argv: Sequence[str], *, stdin: str | None = None) -> Result:
        return await self.transport.run(argv, stdin=stdin)

    async def _failure_output(self, identity: Identity, job: SlurmJob, now: float) -> tuple[str, ...]:
        """The last lines of the job's output (every node's, then the batch script's): evidence, and
        whether Slurm killed a step for its memory or someone cancelled one. Read once per ended job,
        except while it may still change (:attr:`~dispatch_slurm.causes.Facts.settling`)."""
        if (kept := self._output_cache.get(job.job_id)) is not None:
            return kept
        n = self.settings.output_tail_lines
        if not n:
            return ()
        lines = await self.queries.tails(job_dir(self.info.workdir, identity), n)
        if not Facts(job=job, job_ref=job.job_id, now=now, output=lines).settling:
            self._output_cache[job.job_id] = lines
        return lines

    async def _facts(self, identity: Identity, ref: str, job: SlurmJob | None, now: float) -> Facts:
        marks = naming.parse_comment(job.comment) if job is not None else None
        output: tuple[str, ...] = ()
        if job is not None and job.state in ("FAILED", "OUT_OF_MEMORY"):
            output = await self._failure_output(identity, job, now)
        cancelled_by_us = marks is not None and marks.cancelled
        if job is not None and job.source == "sacct" and job.state == "CANCELLED":
            cancelled_by_us = await self.queries.exists(self._cancel_marker(identity))
        return Facts(
            job=job,
            job_ref=ref,
            now=now,
            cancelled_by_us=cancelled_by_us,
            requeue_by_slurm=self.settings.requeue == "slurm",
            output=output,
        )

    async def _observation(
        self, identity: Identity, ref: str, job: SlurmJob | None, at: float
    ) -> Observation:
        """``at`` is when Slurm was asked (before the command ran), so observations order by what they saw."""
        outcome = classify(await self._facts(identity, ref, job, at))
        return Observation(_handle(identity, ref, self.cluster_id), outcome, at)

    async def _find(self, handle: Handle) -> SlurmJob | None:
        """The Slurm job of ``handle``: in squeue, else in sacct (checked to be that incarnation);
        ``None`` only when both answered and neither knows it."""
        for job in await self.queries.jobs():
            if job.job_id == handle.ref:
                marks = naming.parse_comment(job.comment)
                if marks is None or not marks.identity.same_incarnation(handle.identity):
                    return None  # the id now names another job: ours is gone
                return job
        for job in await self.queries.accounted(ids=[handle.ref]):
            if job.job_id == handle.ref and job.name == naming.native_name(handle.identity):
                return job
        return None

    def _check(self, handle: Handle) -> None:
        if not isinstance(handle, Handle):
            raise InvalidError(f"expected a Handle, got {type(handle).__name__}", path="handle")
        if handle.backend != NAME:
            raise InvalidError(f"a {handle.backend!r} handle, not a slurm one", path="handle.backend")

    async def observe(self, handle: Handle) -> Observation:
        self._check(handle)
        asked = time.time()
        obs = await self._observation(handle.identity, handle.ref, await self._find(handle), asked)
        if self._poller is not None and self._poller.watchers:
            await self._poller.offer([obs])
        return obs

    async def _observe_all(self, previous: Mapping[str, Handle] | None = None) -> list[Observation]:
        """Every incarnation of this store that squeue lists, and those of ``previous`` it no longer
        lists (read from sacct: one call for all of them; unknown there too, ``lost``)."""
        out = []
        listed = set()
        asked = time.time()
        for job in await self.queries.jobs():
            marks = self._ours(job)
            if marks is not None:
                listed.add(job.job_id)
                out.append(await self._observation(marks.identity, job.job_id, job, asked))
        left = {ref: h for ref, h in (previous or {}).items() if ref not in listed}
        if left:
            found = {j.job_id: j for j in await self.queries.accounted(ids=sorted(left))}
            for ref, h in left.items():
                gone = found.get(ref)
                if gone is not None and gone.name != naming.native_name(h.identity):
                    gone = None
                out.append(await self._observation(h.identity, ref, gone, asked))
        return out

    async def list(self) -> list[Observation]:
        return await self._observe_all()

    # --- writing --------------------------------------------------------------------------------

    def _writable(self, what: str) -> None:
        if self.read_only:
            raise ReadOnlyError(f"this slurm backend was opened read-only: cannot {what}")

    async def _write(self, argv: Sequence[str], what: str) -> Result:
        """Run a write; an outage is ``UnavailableError`` (nothing was done), a lost answer
        ``OutcomeUnknownError``; Slurm's refusal is returned for the caller to judge."""
        try:
            result = await self._run(argv)
        except CommandLostError as exc:
            raise OutcomeUnknownError(f"{what}: {exc}") from None
        if not result.ok:
            failed = failure_of(result)
            if failed is Failure.UNKNOWN:
                raise OutcomeUnknownError(f"{what}: {result.error()}")
            if failed is Failure.UNREACHABLE:
                raise UnavailableError(f"cannot {what}: {result.error()}")
        return result

    async def _existing(self, identity: Identity) -> str | None:
        """The Slurm job id of incarnation ``identity`` if an earlier start submitted it."""
        name = naming.native_name(identity)
        for job in await self.queries.jobs():
            marks = naming.parse_comment(job.comment)
            if job.name == name and marks is not None and marks.identity.same_incarnation(identity):
                if marks.store != self.store_id:
                    raise ConflictError(
                        f"Slurm job {job.job_id} is incarnation {identity} of another dispatch store"
                    )
                return job.job_id
            if (
                marks is not None
                and marks.store == self.store_id
                and marks.identity.same_incarnation(identity)
            ):
                naming.identity_of(job.as_object())  # raises ConflictError: the name does not match
        for job in await self.queries.accounted(name=name):
            if job.name == name:  # the completion log ignores --name: filter here
                return job.job_id
        return None

    async def start(self, prepared: Prepared) -> Handle:
        if not isinstance(prepared, Prepared):
            raise InvalidError(f"expected a Prepared, got {type(prepared).__name__}", path="prepared")
        prepared.check(NAME)
        self._writable("submit a job")
        identity = prepared.identity
        _, directory, script = request_of(prepared.request)
        unknown = f"sbatch did not answer: incarnation {identity} may or may not exist"
        result = await self._submit(["sh", "-c", _SUBMIT, "dispatch-submit", directory], script, unknown)
        if result.returncode == _EXISTED:
            # An earlier start of this identity made the directory: it may have submitted the job.
            existing = await self._existing(identity)
            if existing is not None:
                _log.info("adopted Slurm job %s for %s", existing, identity)
                return _handle(identity, existing, self.cluster_id)
            result = await self._submit(["sbatch", "--parsable"], script, unknown)
        if result.returncode == _NO_DIRECTORY:
            raise UnavailableError(f"cannot create the job's directory {directory}: {result.error()}")
        if not result.ok:
            failed = failure_of(result)
            if failed is Failure.UNKNOWN:
                raise OutcomeUnknownError(f"{unknown} ({result.error()})")
            if failed is Failure.UNREACHABLE:
                raise UnavailableError(f"cannot submit {identity}: {result.error()}")
            raise UnsupportedError([f"Slurm refused the job: {result.error()}"])
        job_id = result.stdout.strip().split(";")[0]
        if not job_id.isdigit():
            raise OutcomeUnknownError(f"sbatch answered {result.stdout.strip()[:80]!r}, not a job id")
        _log.info("submitted Slurm job %s for %s", job_id, identity)
        return _handle(identity, job_id, self.cluster_id)

    async def _submit(self, argv: Sequence[str], script: str, unknown: str) -> Result:
        try:
            return await self._run(argv, stdin=script)
        except CommandLostError as exc:  # sent, and the answer lost: the job may exist
            raise OutcomeUnknownError(f"{unknown} ({exc})") from None

    async def stop(self, handle: Handle) -> None:
        self._check(handle)
        self._writable("cancel a job")
        job = await self._find(handle)
        if job is None or job.final:
            return
        # Marked twice: in the comment (what squeue shows) and by a file in the job's directory (what
        # outlives squeue: the completion log keeps no comment).
        answer(await self._run(["touch", self._cancel_marker(handle.identity)]), "mark the job cancelled")
        if naming.CANCEL_MARK not in job.comment.split():
            # Marked first, so whoever observes the end reads "cancelled by dispatch", not by someone else.
            await self._write(
                ["scontrol", "update", f"jobid={job.job_id}", f"Comment={job.comment} {naming.CANCEL_MARK}"],
                f"mark Slurm job {job.job_id} cancelled",
            )
        # A refusal here is a job that ended meanwhile ("already completing or completed"): done.
        await self._write(["scancel", job.job_id], f"cancel Slurm job {job.job_id}")
        _log.info("cancelled Slurm job %s of %s", job.job_id, handle.identity)

    def _cancel_marker(self, identity: Identity) -> str:
        return f"{job_dir(self.info.workdir, identity)}/{CANCEL_FILE}"

    # --- holds ----------------------------------------------------------------------------------

    async def _update(self, job_id: str, *settings: str) -> Result:
        return await self._write(
            ["scontrol", "update", f"jobid={job_id}", *settings], f"update Slurm job {job_id}"
        )

    async def hold(self, handle: Handle) -> HoldToken:
        self._check(handle)
        self._writable("hold a job")
        job = await self._find(handle)
        if job is None or job.final:
            raise ConflictError(f"incarnation {handle.identity} has ended: there is nothing to hold")
        if job.state != "PENDING":
            # Slurm cannot hold a running job in place: it is requeued (stopped), then held by start time.
            await self._requeue(job)
        before = job.eligible_time if job.state == "PENDING" else None
        # Each hold writes a start time the job did not show before, so an older token goes stale even
        # when two holds fall in the same second.
        token = ""
        for extra in range(5):
            updated = await self._update(job.job_id, f"StartTime=now+{HOLD_BASE + extra}")
            if not updated.ok:
                raise ConflictError(f"Slurm refused to hold job {job.job_id}: {updated.error()}")
            again = await self._find(handle)
            if again is None:
                raise ConflictError(f"incarnation {handle.identity} vanished while being held")
            token = _hold_token(again)
            if again.eligible_time != before:
                break
        _log.info("held Slurm job %s of %s", job.job_id, handle.identity)
        return HoldToken(token)

    async def _requeue(self, job: SlurmJob) -> None:
        # Two steps (a job submitted --no-requeue must be made requeueable first); a crash between them
        # leaves Requeue=1 on a running job, which is harmless: dispatch still decides what follows.
        await self._update(job.job_id, "Requeue=1")
        done = await self._write(["scontrol", "requeue", job.job_id], f"requeue Slurm job {job.job_id}")
        if not done.ok:
            raise ConflictError(f"Slurm refused to requeue running job {job.job_id}: {done.error()}")
        if self.settings.requeue == "dispatch":
            await self._update(job.job_id, "Requeue=0")

    async def release(self, handle: Handle, token: HoldToken) -> None:
        self._check(handle)
        self._writable("release a job")
        job = await self._find(handle)
        # A running job that was held is requeued: it stays COMPLETING, with the held start time, until
        # its nodes have cleaned up, then is PENDING. A release in that window waits for it (seen under
        # load: a release right after the hold found it COMPLETING and called the token stale).
        settled = time.monotonic() + REQUEUE_SETTLE
        while job is not None and job.completing and token == _hold_token(job) and time.monotonic() < settled:
            await asyncio.sleep(0.2)
            job = await self._find(handle)
        if job is None or job.state != "PENDING" or job.completing or token != _hold_token(job):
            raise StaleHoldError(
                f"the hold token of {handle.identity} no longer matches what Slurm shows "
                f"({'gone' if job is None else job.shown + ', start time ' + str(job.eligible_time)})"
            )
        # now+1, not now: a hold of a running job requeued it, which revokes its launch credential, and
        # slurmd refuses a credential made in the same second as a revocation ("Killing non-startable
        # batch JobId=N: Job credential revoked": the job ends FAILED, exit 1). Seen when a release came
        # within a second of the hold (issue 21's fault series); a second later costs a held job nothing.
        updated = await self._update(job.job_id, "StartTime=now+1")
        if not updated.ok:
            raise ConflictError(f"Slurm refused to release job {job.job_id}: {updated.error()}")
        _log.info("released Slurm job %s of %s", job.job_id, handle.identity)

    # --- watch ----------------------------------------------------------------------------------

    @property
    def polls(self) -> int:
        """How many polls the shared watch poll has made (one ``squeue --json`` each, and one ``sacct``
        for jobs that left the queue)."""
        return self._poller.polls if self._poller is not None else 0

    def _the_poller(self) -> _Poller:
        if self._poller is None:
            self._poller = _Poller(self)
        return self._poller

    async def watch(self, cursor: str | None = None, *, share: Share | None = None) -> AsyncIterator[Change]:
        """Changes of every incarnation (of the jobs in ``share``, when given), from the shared poll."""

        def wanted(handle: Handle) -> bool:
            return share is None or share.holds(handle.identity.job_id)

        poller = self._the_poller()
        poller.watchers += 1
        poller.start()
        try:
            position: int | None = None
            if cursor is not None:
                pid, _, seq = cursor.partition(":")
                oldest = poller.history[0][0] if poller.history else poller.seq + 1
                if pid == poller.id and seq.isdigit() and int(seq) + 1 >= oldest:
                    position = int(seq)
            if position is None:
                async with poller.cond:
                    if poller.seq == 0:
                        await poller.cond.wait()
                    position = poller.seq
                    current = list(poller.last.values())
                for obs in current:
                    if wanted(obs.handle):
                        yield Change(obs, poller.cursor(position))
            seen: int = position
            while True:
                async with poller.cond:
                    while poller.seq <= seen:
                        await poller.cond.wait()
                    batch = [c for s, c in poller.history if s > seen]
                    seen = poller.seq
                for change in batch:
                    if wanted(change.handle):
                        yield change
        finally:
            poller.watchers -= 1
            if poller.watchers == 0 and poller.task is not None:
                poller.task.cancel()
                poller.task = None

    # --- cessation ------------------------------------------------------------------------------

    async def ceased(self, handle: Handle) -> bool:
        """The job is in a final state, no longer ``COMPLETING`` (a flag anywhere in its state), and
        none of its steps is listed; gone from squeue and sacct, it has ceased too."""
        self._check(handle)
        job = await self._find(handle)
        if job is None or job.source == "sacct":
            return True  # squeue no longer lists it: none of its steps can remain
        if not job.final or job.completing:
            return False
        return job.job_id not in await self.queries.stepping()

    async def wait_ceased(self, handle: Handle) -> None:
        # Slurm tells no one when a job's last process is gone: ask again each interval.
        while not await self.ceased(handle):  # noqa: ASYNC110
            await asyncio.sleep(min(1.0, float(self.settings.poll_interval)))

    # --- output ---------------------------------------------------------------------------------

    async def output(
        self,
        handle: Handle,
        *,
        node: int = 0,
        follow: bool = False,
        tail: int | None = None,
        previous: bool = False,
        since: float | None = None,
        timestamps: bool = False,
    ) -> AsyncIterator[str]:
        self._check(handle)
        if previous:
            raise NotFoundError(f"Slurm keeps no previous run of {handle.identity}'s nodes")
        if since is not None or timestamps:
            # The per-node output files keep no time per line: nothing to filter or show by.
            raise UnsupportedError("Slurm's output files keep no time per line: --since and --timestamps")
        job = await self._find(handle)
        path = node_output(self.info.workdir, handle.identity, node)
        # The node count from the reading, else from the job's directory: an ended job that only the
        # completion log (or nothing) still knows keeps its node files.
        nodes = job.node_count if job is not None else 0
        if node < 0 or (node >= nodes and not await self.queries.exists(path)):
            raise NotFoundError(
                f"incarnation {handle.identity} has {max(nodes, 1)} node(s); there is no node {node}"
            )
        if tail is not None and tail <= 0:
            return
        text = await self._read(path, job)
        lines = text.splitlines()
        if tail is not None:
            lines = lines[-tail:]
        for line in lines:
            yield line
        if not follow:
            return
        offset = len(text.encode())
        pending = ""
        interval = min(1.0, float(self.settings.poll_interval))
        while True:
            job = await self._find(handle)
            ended = job is None or (job.final and not job.completing)
            chunk = await self.queries.text(path, offset=offset)
            offset += len(chunk.encode())
            pending += chunk
            *done, pending = pending.split("\n")
            for line in done:
                yield line
            if ended:
                if pending:
                    yield pending
                return
            await asyncio.sleep(interval)

    async def _read(self, path: str, job: SlurmJob | None) -> str:
        # A node that runs but has not written yet is given a moment: its first line is on its way.
        text = ""
        for _ in range(30):
            text = await self.queries.text(path)
            if text or job is None or job.state != "RUNNING":
                return text
            await asyncio.sleep(0.1)
        return text

    async def close(self) -> None:
        if self._poller is not None and self._poller.task is not None:
            self._poller.task.cancel()
            self._poller.task = None
        await self.transport.close()


async def open_backend(settings: Settings, *, read_only: bool = False, store_id: str = "") -> SlurmBackend:
    """Open the cluster ``settings`` name: read it (read-only commands) and check the settings."""
    transport = open_transport(settings)
    try:
        info = await read_cluster(settings, transport)
    except BaseException:
        await transport.close()
        raise
    _log.info("opened Slurm %s, cluster %s (%s)", info.version, info.cluster_name, info.dialect.data_parser)
    return SlurmBackend(settings, transport, info, read_only=read_only, store_id=store_id)


async def factory(cfg: AdapterConfig) -> SlurmBackend:
    """Open a slurm backend from an :class:`AdapterConfig` (the token, if any, is not used: Slurm's
    commands authenticate with munge, ssh with its keys)."""
    settings = parse_settings(cfg.settings)
    return await open_backend(settings, read_only=cfg.read_only, store_id=cfg.store_id)
