"""The ``memory`` backend: the adapter SPI over a :class:`~dispatch.memory.cluster.MemoryCluster`."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Mapping
from typing import Any

from dispatch.backend import HoldToken, Prepared
from dispatch.clock import Clock
from dispatch.errors import InvalidError, ReadOnlyError, UnavailableError, UnsupportedError
from dispatch.execlimits import check_exec
from dispatch.feed import Feed
from dispatch.memory import naming
from dispatch.memory.cluster import MemoryCluster, Overlap, native_object, shared_cluster
from dispatch.memory.script import FAULTS, SCRIPT_ENV, Step, parse_script
from dispatch.memory.settings import MemorySettings
from dispatch.model import (
    Absent,
    Capabilities,
    Change,
    Handle,
    Identity,
    Image,
    JobSpec,
    Limits,
    Mode,
    Observation,
    OpaqueExtension,
    Share,
    SharedCheckpoint,
    Unreachable,
)

__all__ = ["ACCEPTED_EXTENSIONS", "NAME", "MemoryBackend"]

NAME = "memory"
ACCEPTED_EXTENSIONS = frozenset({Image.NAME, SharedCheckpoint.NAME})


class MemoryBackend:
    """An in-process cluster for tests, examples and the supervisor's simulations.

    Implements :class:`~dispatch.backend.Backend`, ``Holder``, ``Watcher``, ``CessationSignal``,
    and ``IdentityWeakener`` (every protocol but ``OutputReader``). Time comes from
    ``clock`` (default: the system clock); there are no background tasks. Several backends may share
    one ``cluster`` (e.g. a read-only view of a writable one, or a supervisor "restarted" on the same
    cluster); ``settings`` and ``clock`` then come from the cluster and must not be passed.
    """

    def __init__(
        self,
        settings: MemorySettings | None = None,
        *,
        clock: Clock | None = None,
        read_only: bool = False,
        cluster: MemoryCluster | None = None,
        store_id: str = "",
    ) -> None:
        if settings is not None and not isinstance(settings, MemorySettings):
            raise InvalidError(
                f"expected MemorySettings (or parse_settings(raw)), got {type(settings).__name__}",
                path="settings",
            )
        if cluster is not None:
            if settings is not None or clock is not None:
                raise InvalidError("pass a cluster, or settings and a clock, not both", path="cluster")
            self.cluster = cluster
        elif settings is not None and settings.cluster is not None:
            from dispatch.clock import SystemClock

            self.cluster = shared_cluster(settings, clock or SystemClock())
        else:
            self.cluster = MemoryCluster(settings, clock=clock)
        self.read_only = read_only
        self.store_id = store_id
        self._closed = False
        self._position: int | None = None  # how far the feed has read the cluster's change log
        self.feed = Feed(self._fill, catch_up=self._catch_up)
        """The host's feed this backend fills from the cluster's change log (its watch)."""

    def __repr__(self) -> str:
        return f"MemoryBackend(nodes={self.cluster.settings.nodes}, read_only={self.read_only})"

    @property
    def name(self) -> str:
        return NAME

    @property
    def cluster_id(self) -> str:
        return self.cluster.id

    @property
    def settings(self) -> MemorySettings:
        return self.cluster.settings

    @property
    def overlaps(self) -> builtins.list[Overlap]:
        """Times two incarnations of one job had compute at once (see :class:`Overlap`)."""
        return list(self.cluster.overlaps)

    # --- Backend ----------------------------------------------------------------------------------

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        self._open()
        if spec is not None:
            self._check(spec)
            # Checking a spec reads the cluster, as a real adapter's does (Kubeflow reads the runtime,
            # Slurm asks `sbatch --test-only`): it fails while the cluster does not answer.
            self.cluster.check_answering()
        return Capabilities(
            mode=Mode.READ_ONLY if self.read_only else Mode.READ_WRITE,
            holds=True,
            watch=True,
            output=False,
            cessation=True,
            shared_checkpoint=True,
            queueing=True,
            extensions=ACCEPTED_EXTENSIONS,
            limits=Limits(max_nodes=self.settings.nodes),
            notes=(
                f"in-process memory cluster: {self.settings.nodes} nodes, strict FIFO queue",
                "no output: jobs are scripted with env KUBESIM_SCRIPT, not run",
            ),
        )

    async def prepare(self, spec: JobSpec, identity: Identity, *, held: bool = False) -> Prepared:
        """Every check ``start`` makes, and the object it would create. It writes nothing, so a
        read-only backend prepares too (that is a dry run)."""
        self._open()
        self._check(spec)
        if not isinstance(identity, Identity):
            raise InvalidError(f"expected an Identity, got {type(identity).__name__}", path="identity")
        obj = native_object(naming.native_name(identity), spec, identity, held=held)
        return Prepared(NAME, spec, identity, held, obj)

    async def start(self, prepared: Prepared) -> Handle:
        self._writable("start")
        if not isinstance(prepared, Prepared):
            raise InvalidError(
                f"expected a Prepared (from prepare), got {type(prepared).__name__}", path="prepared"
            )
        prepared.check(NAME)
        spec, identity = prepared.spec, prepared.identity
        steps = self._check(spec)
        name = naming.native_name(identity)
        handle = Handle(NAME, identity, name, cluster=self.cluster.id)
        return self.cluster.create(name, handle, spec, steps, held=prepared.held, store=self.store_id)

    async def observe(self, handle: Handle) -> Observation | Absent:
        self._open()
        return self.cluster.observe(self._ours(handle))

    async def stop(self, handle: Handle) -> None:
        """Cancel the incarnation. Idempotent: stopping an ended or unknown incarnation does nothing."""
        self._writable("stop")
        self.cluster.stop(self._ours(handle))

    async def list(self) -> builtins.list[Observation]:
        self._open()
        return [o for o in self.cluster.observations() if self._mine(o.handle)]

    async def close(self) -> None:
        self._closed = True
        await self.feed.close()

    # --- Holder -----------------------------------------------------------------------------------

    async def hold(self, handle: Handle) -> HoldToken:
        """Hold the incarnation: a queued one leaves the queue; a starting or running one gives its
        nodes back (its compute lingers ``cessationDelay``) and starts from scratch once released.
        Holding a held incarnation (e.g. one started ``held=True``) returns its current token."""
        self._writable("hold")
        return HoldToken(self.cluster.hold(self._ours(handle)))

    async def release(self, handle: Handle, token: HoldToken) -> None:
        """Release the hold proven by ``token``: the incarnation queues again. A token that is not the
        current hold's raises ``ConflictError``."""
        self._writable("release")
        self.cluster.release(self._ours(handle), str(token))

    # --- Watcher ----------------------------------------------------------------------------------

    def watch(self, cursor: str | None = None, *, share: Share | None = None) -> AsyncIterator[Change]:
        """Changes of every incarnation (of the jobs in ``share``, when given), from the host's feed
        (:class:`~dispatch.feed.Feed`), which this backend fills from the cluster's change log."""
        self._open()
        return self.feed.watch(cursor, share=share)

    def watch_job(self, job_id: str) -> AsyncIterator[Change]:
        """The changes of job ``job_id``'s incarnations only (``JobWatcher``)."""
        self._open()
        return self.feed.watch(job_id=job_id)

    def _catch_up(self, feed: Feed) -> None:
        """Offer every reading the cluster logged since the last call (this store's jobs only); relist
        after an outage or a position the log no longer holds, as a list+watch does."""
        if self.cluster.answering() is not None:
            feed.troubled(Unreachable(self.cluster.clock.now(), "the memory cluster does not answer"))
            self._position = None  # a watch broken by an outage lists again
            return
        try:
            readings, self._position = self.cluster.changes(self._position)
        except UnavailableError as exc:
            feed.troubled(Unreachable(self.cluster.clock.now(), str(exc)))
            self._position = None
            return
        feed.troubled(None)
        for reading in readings:
            if self._mine(reading.handle):
                feed.offer(reading)

    async def _fill(self, feed: Feed) -> None:
        """The feed's source: catch up, then wait for the cluster's next change, for ever."""
        while True:
            self._catch_up(feed)
            await self.cluster.wait_for_change(seen=self._position)

    # --- CessationSignal ----------------------------------------------------------------------------

    async def ceased(self, handle: Handle) -> bool:
        self._open()
        return self.cluster.ceased(self._ours(handle))

    async def wait_ceased(self, handle: Handle) -> None:
        self._open()
        await self.cluster.wait_ceased(self._ours(handle))

    # --- IdentityWeakener ---------------------------------------------------------------------------

    def native_name(self, identity: Identity) -> str:
        return naming.native_name(identity)

    def identity_of(self, obj: Mapping[str, Any]) -> Identity | None:
        return naming.identity_of(obj)

    # --- cluster events, for tests and demos (not part of the SPI) ---------------------------------

    async def inject(self, handle: Handle, action: str, *, rank: int = 0) -> None:
        """Make something happen to a starting or running incarnation now, as the cluster would.

        ``action`` is one script step without guards: ``"preempt"``, ``"evict"``, ``"lose-node"`` (every
        job with compute on that rank's node fails ``node_lost``), ``"oom"``, ``"exit <code>"`` (0: the
        whole job succeeds; otherwise it fails ``exit_code``), ``"hang"`` (never end by itself) or
        ``"slow-stop <seconds>"`` (stopping it takes that long; allowed in any state). ``rank`` picks the
        node. A job that is not starting or running raises ``ConflictError``; a malformed action
        ``InvalidError``. Cluster events are not writes by dispatch, so a read-only backend allows them."""
        self._open()
        steps = parse_script(action, path="action")
        if len(steps) != 1 or steps[0].guards or steps[0].verb in ("sleep", "print"):
            raise InvalidError(
                f"expected one event: {', '.join(sorted(FAULTS))}, exit <code>, hang or slow-stop <seconds>; "
                f"got {action!r}",
                path="action",
            )
        step = steps[0]
        self.cluster.inject(self._ours(handle), step.verb, rank=rank, code=step.code, seconds=step.seconds)

    async def preempt(self, handle: Handle, *, rank: int = 0) -> None:
        """The scheduler preempts the job: ``failed``/``preempted``."""
        await self.inject(handle, "preempt", rank=rank)

    async def evict(self, handle: Handle, *, rank: int = 0) -> None:
        """The job is evicted: ``failed``/``evicted``."""
        await self.inject(handle, "evict", rank=rank)

    async def lose_node(self, handle: Handle, *, rank: int = 0) -> None:
        """The node under ``rank`` is lost: every job on it fails ``node_lost``."""
        await self.inject(handle, "lose-node", rank=rank)

    async def oom(self, handle: Handle, *, rank: int = 0) -> None:
        """The process on ``rank`` is OOM-killed: ``failed``/``out_of_memory`` (exit code 137)."""
        await self.inject(handle, "oom", rank=rank)

    async def exit(self, handle: Handle, code: int, *, rank: int = 0) -> None:
        """The job exits with ``code``: 0 succeeds the whole job, anything else fails it ``exit_code``."""
        if isinstance(code, bool) or not isinstance(code, int) or not 0 <= code <= 255:
            raise InvalidError(f"expected an exit code 0..255, got {code!r}", path="code")
        await self.inject(handle, f"exit {code}", rank=rank)

    async def vanish(self, handle: Handle) -> None:
        """The job's object disappears without dispatch deleting it: it is then observed ``lost``."""
        self._open()
        self.cluster.vanish(self._ours(handle))

    def objects(self) -> builtins.list[dict[str, Any]]:
        """The native object (with a ``status``) of every incarnation on the cluster."""
        return self.cluster.objects()

    # --- helpers ----------------------------------------------------------------------------------

    def _open(self) -> None:
        if self._closed:
            raise UnavailableError("this memory backend is closed; open a new one")

    def _writable(self, what: str) -> None:
        self._open()
        if self.read_only:
            raise ReadOnlyError(
                f"{what}: this memory backend is read-only; open it without read_only to write"
            )

    def _mine(self, handle: Handle) -> bool:
        """Whether an object was created for this backend's store (another store's are left alone)."""
        return self.cluster.store_of(handle.ref) == self.store_id

    def _ours(self, handle: Handle) -> Handle:
        if not isinstance(handle, Handle):
            raise InvalidError(f"expected a Handle, got {type(handle).__name__}", path="handle")
        if handle.backend != NAME:
            raise InvalidError(f"a handle of backend {handle.backend!r}, not {NAME!r}", path="handle.backend")
        return handle

    def _check(self, spec: JobSpec) -> tuple[Step, ...]:
        """Every check ``start`` makes: the script parses (``InvalidError``), then every reason this
        cluster cannot run the spec, all at once (``UnsupportedError``)."""
        if not isinstance(spec, JobSpec):
            raise InvalidError(f"expected a JobSpec, got {type(spec).__name__}", path="spec")
        script = spec.env.get(SCRIPT_ENV, self.settings.default_script)
        steps = parse_script(script)
        # Not kinder than a real cluster: its nodes are Linux machines, which could not start this process.
        check_exec(spec.command, spec.env, where="a node of the memory cluster")
        reasons: list[str] = []
        for ext_name, value in spec.extensions.items():
            if isinstance(value, OpaqueExtension):
                reasons.append(
                    f'extension "{ext_name}" is unknown in this process (not registered) and the memory '
                    f"adapter accepts only {', '.join(sorted(ACCEPTED_EXTENSIONS))}"
                )
            elif ext_name not in ACCEPTED_EXTENSIONS:
                reasons.append(
                    f'extension "{ext_name}" is not supported by the memory adapter; '
                    f"it accepts {', '.join(sorted(ACCEPTED_EXTENSIONS))}"
                )
        if spec.nodes > self.settings.nodes:
            reasons.append(
                f"the job asks for {spec.nodes} nodes; this memory cluster has {self.settings.nodes} "
                '(setting "nodes")'
            )
        if reasons:
            raise UnsupportedError(reasons)
        return steps
