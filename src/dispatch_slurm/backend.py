"""The Slurm backend: every protocol of the SPI over Slurm's commands (run through a transport).

A pure reporter (SPEC §5): ``observe``/``list`` and the watch give typed readings — an observation with
whether the job's compute remains, or *absent* for an incarnation a complete answer does not show — read
by :class:`~dispatch_slurm.observing.Observing`; an answer that did not come (controller down, munge down,
ssh cut, a timeout, an answer carrying ``errors``) raises ``UnavailableError`` (:mod:`~dispatch_slurm.answers`).
The host decides what they mean for a record (:mod:`dispatch.fold`) and owns the watch (the backend's
:class:`~dispatch.feed.Feed`, filled by :class:`~dispatch_slurm.polls.Polls`). Decisions are the pure
modules' (:mod:`~dispatch_slurm.causes`, :mod:`~dispatch_slurm.readings`, :mod:`~dispatch_slurm.script`,
:mod:`~dispatch_slurm.naming`); holds are :mod:`~dispatch_slurm.holds`', output :mod:`~dispatch_slurm.output`'s.

A start is one round trip: the job's directory is made and the script submitted by one ``sh -c``. The
directory — named after the incarnation, the record's nonce included — doubles as the record of an
earlier attempt: ``mkdir`` of it succeeds for exactly one start of an identity, so only a start that finds
it made already (an earlier start whose outcome is unknown, or one that crashed before its handle was
recorded) looks the identity up before submitting.
"""

from __future__ import annotations

import asyncio
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
from dispatch.feed import Feed
from dispatch.model import (
    Absent,
    Capabilities,
    Cause,
    Change,
    Compute,
    Evidence,
    Handle,
    Identity,
    JobSpec,
    Limits,
    Mode,
    Observation,
    Outcome,
    Share,
    State,
)
from dispatch.probecache import ProbeCache
from dispatch_slurm import naming, output
from dispatch_slurm.answers import Failure, failure_of
from dispatch_slurm.clusterfacts import TTL, read_cached
from dispatch_slurm.holds import Holds
from dispatch_slurm.observing import NAME, Observing
from dispatch_slurm.polls import Polls
from dispatch_slurm.preflight import ClusterInfo
from dispatch_slurm.queries import Queries
from dispatch_slurm.script import ACCEPTED_EXTENSIONS, build_request, refusals, request_of
from dispatch_slurm.settings import Settings, parse_settings
from dispatch_slurm.transport import CommandLostError, LocalTransport, Result, SshTransport, open_transport

__all__ = ["NAME", "SlurmBackend", "factory", "open_backend"]

_log = logging.getLogger(__name__)

_SUBMIT = (
    "submit() { "
    'if [ "$2" != clean ]; then exec sbatch --parsable; fi; '
    'bin="$(command -v sbatch)" || exit 127; '
    'if [ -n "${SLURM_CONF:-}" ]; then exec env -i SLURM_CONF="$SLURM_CONF" "$bin" --parsable; fi; '
    'exec env -i "$bin" --parsable; }; '
    'if [ "${3:-}" = again ]; then submit "$@"; fi; '
    'if mkdir -- "$1" 2>/dev/null; then submit "$@"; fi; '
    '[ -d "$1" ] && exit 75; '
    'mkdir -p -- "${1%/*}" && mkdir -- "$1" || exit 74; '
    'submit "$@"'
)
"""One round trip for a start (``sh -c _SUBMIT dispatch-submit DIR ENVIRONMENT [again]``): make the job's
directory, then submit the script (stdin) — or say the directory was there already (75: an earlier start of
this identity) or could not be made (74); ``again`` submits without making it. With ``environment: clean``
sbatch runs with nothing of this shell's environment but ``SLURM_CONF`` (``--export=ALL`` then passes the
job nothing else: the script sets the rest)."""
_EXISTED, _NO_DIRECTORY = 75, 74
_CHECK_IDENTITY = Identity("dispatch-capabilities-check")


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
        self.feed = Feed(self._fill, idle_stop=True, current=lambda: self._polls.current())
        """The host's feed, which this backend fills from its polls (only while something watches)."""
        self.observing = Observing(self.queries, info, settings, store_id, self.feed)
        self._polls = Polls(self.observing, float(settings.poll_interval))
        self._holds = Holds(self.observing, self._write, requeue_by_slurm=settings.requeue == "slurm")

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
        if self.info.kept_since is not None:
            kept = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.info.kept_since))
            notes.append(
                f"the cluster's configuration as read at {kept} (kept {TTL / 60:g} min; "
                "`dispatch check --refresh` reads it again)"
            )
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
        tested = await self.transport.run(["sbatch", "--test-only"], stdin=script)
        if tested.ok:
            return
        if failure_of(tested) is not Failure.REFUSED:
            raise UnavailableError(f"cannot ask Slurm whether it would run the job: {tested.error()}")
        raise UnsupportedError([f"Slurm would not run it: {tested.error()}"])

    # --- reading --------------------------------------------------------------------------------

    def _check(self, handle: Handle) -> None:
        if not isinstance(handle, Handle):
            raise InvalidError(f"expected a Handle, got {type(handle).__name__}", path="handle")
        if handle.backend != NAME:
            raise InvalidError(f"a {handle.backend!r} handle, not a slurm one", path="handle.backend")

    async def observe(self, handle: Handle) -> Observation | Absent:
        """One reading: squeue (and accounting for a job that left the queue), as of now."""
        self._check(handle)
        asked = time.time()
        return await self.observing.read(handle, await self.observing.find(handle), asked)

    async def list(self) -> list[Observation]:
        """A reading of every incarnation of this store's that squeue lists (one ``squeue``), offered to
        the feed too: the watch's next poll is due an interval after it."""
        asked, began = time.time(), time.monotonic()
        found = await self.observing.listed(await self.queries.jobs(), asked)
        self._polls.listed(found, began)
        return found

    # --- writing --------------------------------------------------------------------------------

    def _writable(self, what: str) -> None:
        if self.read_only:
            raise ReadOnlyError(f"this slurm backend was opened read-only: cannot {what}")

    async def _write(self, argv: Sequence[str], what: str) -> Result:
        """Run a write; an outage is ``UnavailableError`` (nothing was done), a lost answer
        ``OutcomeUnknownError``; Slurm's refusal is returned for the caller to judge."""
        try:
            result = await self.transport.run(argv)
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
        """The Slurm job id of incarnation ``identity`` if an earlier start submitted it (its name carries
        the record's nonce: a purged record's job of the same job id is not it)."""
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
        asked, began = time.time(), time.monotonic()
        argv = ["sh", "-c", _SUBMIT, "dispatch-submit", directory, self.settings.environment]
        result = await self._submit(argv, script, unknown)
        if result.returncode == _EXISTED:
            # An earlier start of this identity made the directory: it may have submitted the job.
            existing = await self._existing(identity)
            if existing is not None:
                _log.info("adopted Slurm job %s for %s", existing, identity)
                return self.observing.handle(identity, existing)
            result = await self._submit([*argv, "again"], script, unknown)
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
        handle = self.observing.handle(identity, job_id)
        self._submitted(handle, prepared.held, asked, began)
        return handle

    def _submitted(self, handle: Handle, held: bool, asked: float, began: float) -> None:
        """Slurm's answer to ``sbatch`` is a reading of its own: the job is in the queue (held, when it
        was submitted held). Offered to the feed — unless a poll already read the job — so the host
        knows the new incarnation's state without asking Slurm again (:func:`dispatch.backend.recent`)."""
        if self.feed.last(handle.ref) is not None:
            return
        ev = Evidence(
            "SlurmJob",
            handle.ref,
            reason="PENDING",
            message="submitted held (its start time ten years ahead)"
            if held
            else "submitted: sbatch queued it",
            at=asked,
        )
        outcome = Outcome(State.HELD if held else State.QUEUED, Cause.NONE, (ev,))
        self.feed.offer(Observation(handle, outcome, asked, Compute.GONE))
        self._polls.submitted(handle, began)

    async def _submit(self, argv: Sequence[str], script: str, unknown: str) -> Result:
        try:
            return await self.transport.run(argv, stdin=script)
        except CommandLostError as exc:  # sent, and the answer lost: the job may exist
            raise OutcomeUnknownError(f"{unknown} ({exc})") from None

    async def stop(self, handle: Handle) -> None:
        """``scancel`` the job (idempotent: an ended job, or one Slurm no longer knows, is left). Whether
        dispatch asked for it is the record's to say (``cancel_requested``), not the job's."""
        self._check(handle)
        self._writable("cancel a job")
        job = await self.observing.find(handle)
        if job is None or job.final:
            return
        # A refusal here is a job that ended meanwhile ("already completing or completed"): done.
        await self._write(["scancel", job.job_id], f"cancel Slurm job {job.job_id}")
        _log.info("cancelled Slurm job %s of %s", job.job_id, handle.identity)

    # --- holds ----------------------------------------------------------------------------------

    async def hold(self, handle: Handle) -> HoldToken:
        self._check(handle)
        self._writable("hold a job")
        return await self._holds.hold(handle)

    async def release(self, handle: Handle, token: HoldToken) -> None:
        self._check(handle)
        self._writable("release a job")
        await self._holds.release(handle, token)

    # --- watch ----------------------------------------------------------------------------------

    @property
    def polls(self) -> int:
        """How many polls the watch has made (one ``squeue --json`` each, and one ``sacct`` for jobs
        that left the queue)."""
        return self._polls.count

    @property
    def early_polls(self) -> int:
        """How many of those polls an end marker brought forward (:mod:`~dispatch_slurm.polls`)."""
        return self._polls.early

    async def _fill(self, feed: Feed) -> None:
        await self._polls.fill(feed)

    def watch(self, cursor: str | None = None, *, share: Share | None = None) -> AsyncIterator[Change]:
        """Changes of every incarnation of this store's (of the jobs in ``share``, when given), from the
        host's feed, which one poll per ``pollInterval`` fills for every watch of the backend (SPEC §13
        "Watch")."""
        return self._watch(cursor, None, share)

    def watch_job(self, job_id: str) -> AsyncIterator[Change]:
        """The changes of job ``job_id``'s incarnations only (``JobWatcher``), from the same polls."""
        if not isinstance(job_id, str) or not job_id:
            raise InvalidError(f"expected a job id, got {job_id!r}", path="job_id")
        return self._watch(None, job_id, None)

    async def _watch(
        self, cursor: str | None, job_id: str | None, share: Share | None
    ) -> AsyncIterator[Change]:
        await self._polls.fresh()  # a watch starts from what Slurm shows now, not from long ago
        changes = self.feed.watch(cursor, job_id=job_id, share=share)
        try:
            async for change in changes:
                yield change
        finally:
            await changes.aclose()  # type: ignore[attr-defined]

    # --- cessation ------------------------------------------------------------------------------

    async def ceased(self, handle: Handle) -> bool:
        """The job is in a final state, no longer ``COMPLETING`` (a flag anywhere in its state), and
        none of its steps is listed; gone from squeue and sacct, it has ceased too."""
        self._check(handle)
        job = await self.observing.find(handle)
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
        interval = float(self.settings.poll_interval)
        lines = output.lines(self.observing, handle, node=node, follow=follow, tail=tail, interval=interval)
        async for line in lines:
            yield line

    async def close(self) -> None:
        await self.feed.close()
        await self._polls.close()
        await self.transport.close()


async def open_backend(
    settings: Settings, *, read_only: bool = False, store_id: str = "", cache: ProbeCache | None = None
) -> SlurmBackend:
    """Open the cluster ``settings`` name: read it (read-only commands; from ``cache`` when it keeps what
    an earlier open read: :mod:`~dispatch_slurm.clusterfacts`) and check the settings."""
    transport = open_transport(settings)
    try:
        info = await read_cached(settings, transport, cache, now=time.time())
    except BaseException:
        await transport.close()
        raise
    _log.info("opened Slurm %s, cluster %s (%s)", info.version, info.cluster_name, info.dialect.data_parser)
    return SlurmBackend(settings, transport, info, read_only=read_only, store_id=store_id)


async def factory(cfg: AdapterConfig) -> SlurmBackend:
    """Open a slurm backend from an :class:`AdapterConfig` (the token, if any, is not used: Slurm's
    commands authenticate with munge, ssh with its keys; the probe cache keeps the cluster's facts)."""
    settings = parse_settings(cfg.settings)
    return await open_backend(settings, read_only=cfg.read_only, store_id=cfg.store_id, cache=cfg.probe_cache)
