"""The adapter SPI: the protocols a scheduler backend implements.

:class:`Backend` is required. The others are optional and discovered with ``isinstance`` (they are
``runtime_checkable``); the conformance suite checks an optional protocol only where it is implemented.
Every method that touches a cluster is ``async`` and must honour cancellation and ``asyncio.timeout``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, NewType, Protocol, runtime_checkable

import msgspec.structs
from msgspec import Struct

from dispatch.errors import DispatchError, InvalidError
from dispatch.feed import Feed
from dispatch.model import (
    Absent,
    Capabilities,
    Change,
    Compute,
    Handle,
    Identity,
    JobSpec,
    Observation,
    Share,
)

__all__ = [
    "Backend",
    "CessationSignal",
    "DecisionRecorder",
    "Fed",
    "HoldToken",
    "Holder",
    "IdentityWeakener",
    "JobWatcher",
    "OutputReader",
    "Prepared",
    "Watcher",
    "compute_gone",
    "known",
    "place",
    "recent",
    "record_decision",
]

_log = logging.getLogger("dispatch.backend")

HoldToken = NewType("HoldToken", str)
"""Proof of one hold, returned by :meth:`Holder.hold` and required by :meth:`Holder.release`."""


class Prepared(Struct, frozen=True):
    """One incarnation, checked and ready to send: what :meth:`Backend.prepare` returns and
    :meth:`Backend.start` sends.

    ``request`` is the native object the backend will create (Kubeflow: the TrainJob), exactly as it
    will be sent; a dry run is a ``prepare`` whose result is shown instead of started. ``backend`` names
    the adapter that prepared it: another adapter's ``start`` refuses it.
    """

    backend: str
    spec: JobSpec
    identity: Identity
    held: bool
    request: Mapping[str, Any]

    def __post_init__(self) -> None:
        if not isinstance(self.spec, JobSpec):
            raise InvalidError(f"expected a JobSpec, got {type(self.spec).__name__}", path="spec")
        if not isinstance(self.identity, Identity):
            raise InvalidError(f"expected an Identity, got {type(self.identity).__name__}", path="identity")
        if not isinstance(self.held, bool):
            raise InvalidError(f"expected True or False, got {self.held!r}", path="held")
        if not isinstance(self.request, Mapping):
            raise InvalidError(f"expected a mapping, got {type(self.request).__name__}", path="request")

    def replace(self, **changes: Any) -> Prepared:
        """A copy with ``changes`` applied, checked like a new one."""
        return msgspec.structs.replace(self, **changes)

    def check(self, backend: str) -> Prepared:
        """This request, if it was prepared by adapter ``backend``; else ``InvalidError``."""
        if self.backend != backend:
            raise InvalidError(
                f"prepared by the {self.backend!r} adapter; the {backend!r} adapter cannot start it",
                path="prepared.backend",
            )
        return self


@runtime_checkable
class Backend(Protocol):
    """One opened cluster, as an adapter sees it."""

    @property
    def name(self) -> str:
        """The adapter's registered name (e.g. ``"kubeflow"``)."""
        ...

    @property
    def cluster_id(self) -> str:
        """The identity of the opened cluster: a stable string read from the cluster itself when the
        adapter opened (Kubernetes: the ``kube-system`` namespace's UID; Slurm: its ``ClusterName`` and
        controller), the same for every process that opens it. A record belongs to the cluster of its
        current incarnation, and only a process opened on that cluster changes it (SPEC §6.1).
        Handles the backend returns carry it (``Handle.cluster``)."""
        ...

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        """What this cluster can do. With a ``spec``, also check that this cluster can run it and raise
        ``UnsupportedError`` listing *every* reason (``InvalidError`` for a malformed spec, e.g. a missing
        required extension), creating nothing."""
        ...

    async def prepare(self, spec: JobSpec, identity: Identity, *, held: bool = False) -> Prepared:
        """Make every check :meth:`start` needs and return the native request for incarnation
        ``identity`` of a job, held (created but not admitted to run) if asked — sending nothing.

        Malformed input is ``InvalidError``; what this cluster cannot run is ``UnsupportedError`` with
        every reason. It only reads, so it works on a read-only or observe-only backend: a dry run is a
        ``prepare`` whose result is shown, and that is how a person without write access sees what a
        submit would create."""
        ...

    async def start(self, prepared: Prepared) -> Handle:
        """Create the incarnation :meth:`prepare` returned, sending exactly ``prepared.request``.

        Idempotent per identity: starting an identity that already exists adopts the existing object and
        returns its handle; an object under the same native name with another identity is a
        ``ConflictError``. A create whose response was lost raises ``OutcomeUnknownError``.
        Raises ``ReadOnlyError`` on a read-only or observe-only backend."""
        ...

    async def observe(self, handle: Handle) -> Observation | Absent:
        """A typed reading of the incarnation as of now (SPEC §5): seen — an :class:`Observation` of its
        state, cause and evidence with whether its ``compute`` remains —, or :class:`Absent` when a
        complete answer of the cluster does not list it (nor any compute of it). An answer that cannot be
        trusted (an error, a timeout, a partial answer, an answer carrying errors) raises
        ``UnavailableError``: the host reads it as *unreachable* and changes nothing. Never ``lost``:
        only the host concludes that, from two absent readings."""
        ...

    async def stop(self, handle: Handle) -> None:
        """Ask the cluster to end the incarnation (cancel). Idempotent; returns before the compute is
        gone (see :class:`CessationSignal`)."""
        ...

    async def list(self) -> list[Observation]:
        """An observation of every incarnation of this store's that the cluster shows (an object, or
        compute left of one), from one complete answer; ``UnavailableError`` when there is none."""
        ...

    async def close(self) -> None:
        """Release connections. Idempotent."""
        ...


@runtime_checkable
class Holder(Protocol):
    """Holds: keep an incarnation from running (or stop it running) until released."""

    async def hold(self, handle: Handle) -> HoldToken:
        """Hold the incarnation and return the token that proves this hold."""
        ...

    async def release(self, handle: Handle, token: HoldToken) -> None:
        """Release a hold. A token that no longer matches what the cluster shows, or an older
        incarnation, raises a ``ConflictError`` subclass."""
        ...


@runtime_checkable
class Watcher(Protocol):
    """A stream of changes for every incarnation carrying dispatch's identity."""

    def watch(self, cursor: str | None = None, *, share: Share | None = None) -> AsyncIterator[Change]:
        """Yield a :class:`~dispatch.model.Change` only when the reading of an incarnation changes.
        Resumable from the cursor of any change; survives dropped connections and expired cursors by
        relisting, without losing a transition. ``share``: only the changes of the jobs in it (a fleet
        member's; the others are neither built nor sent to it). An adapter implements it with the
        host's :class:`dispatch.feed.Feed` (``return self.feed.watch(cursor, share=share)``), which it
        only fills."""
        ...


@runtime_checkable
class Fed(Protocol):
    """A :class:`Watcher` that fills the host's :class:`dispatch.feed.Feed` (optional): the host reads
    the feed's ``trouble`` — the source could not read the cluster at its last attempt — as part of a
    supervisor's account of whether its cluster answers. An adapter that reads from a cache its watch
    keeps (Kubeflow's informer) answers reads while that watch fails; only the feed knows."""

    @property
    def feed(self) -> Feed: ...


@runtime_checkable
class JobWatcher(Protocol):
    """A :class:`Watcher` that can follow one job alone, at the cost of that job (optional)."""

    def watch_job(self, job_id: str) -> AsyncIterator[Change]:
        """The changes of job ``job_id``'s incarnations only, as :meth:`Watcher.watch` would emit them:
        first the current observation of each, then every change. ``Cluster.watch(job_id)`` uses it, so a
        thousand jobs each followed on its own cost what following them together does."""
        ...


@runtime_checkable
class CessationSignal(Protocol):
    """Tells when an incarnation's compute is really gone."""

    async def ceased(self, handle: Handle) -> bool:
        """True only when no compute of the incarnation remains (Kubernetes: no pod left). Until then
        the next incarnation must not start: two running at once can corrupt a shared checkpoint."""
        ...

    async def wait_ceased(self, handle: Handle) -> None:
        """Return once :meth:`ceased` is true. Bound it with ``asyncio.timeout``."""
        ...


@runtime_checkable
class OutputReader(Protocol):
    """Lines of output of one node of an incarnation."""

    def output(
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
        """Yield the output lines of node ``node``; with ``follow``, keep yielding until it ends (waiting
        for a pending node to start); ``tail`` limits to the last N lines already written; ``previous``
        reads the node's last terminated run when it restarted in place (``NotFoundError`` if none);
        ``since``: only lines written in the last ``since`` seconds; ``timestamps``: each line starts with
        the RFC 3339 time it was written and a space. The host passes ``previous``, ``since`` and
        ``timestamps`` only when asked for, so a reader without them still serves plain reads."""
        ...


@runtime_checkable
class IdentityWeakener(Protocol):
    """For backends whose native names cannot hold the full identity."""

    def native_name(self, identity: Identity) -> str:
        """A deterministic, lossy native name: sanitised, shortened, with a hash of the full identity."""
        ...

    def identity_of(self, obj: Mapping[str, Any]) -> Identity | None:
        """The identity a native object carries (from labels/annotations), or ``None`` if it carries none.
        Raises ``ConflictError`` when what it carries is inconsistent (its name is not the native name
        of the identity it claims)."""
        ...


@runtime_checkable
class DecisionRecorder(Protocol):
    """Optional: shows the host's decisions about an incarnation where the cluster's operators look
    (Kubeflow: an Event on its TrainJob, in ``kubectl describe trainjob``). ``reason`` is one CamelCase
    word (``Requeued``, ``Held``, ``Cancelled``...), ``message`` names the job and the epoch; ``warning``
    marks a failure or giving up. Best effort: the record stays the truth, a refusal is only logged."""

    async def record_decision(
        self, handle: Handle, reason: str, message: str, *, warning: bool = False
    ) -> None:
        """Show one decision about incarnation ``handle`` on its cluster."""
        ...


async def record_decision(
    backend: Backend, handle: Handle | None, reason: str, message: str, *, warning: bool = False
) -> None:
    """Tell ``backend`` (if it is a :class:`DecisionRecorder`) about a decision on ``handle``; a failure
    is logged, never raised: a decision already recorded must not fail for want of its Event."""
    if handle is None or not isinstance(backend, DecisionRecorder):
        return
    try:
        await backend.record_decision(handle, reason, message, warning=warning)
    except DispatchError as exc:
        _log.info("decision %s on %s not shown on the cluster: %s", reason, handle, exc)


def recent(backend: Backend, handle: Handle) -> Observation | None:
    """A reading of incarnation ``handle`` its backend already holds, at no cost: the last one its
    watch feed (``backend.feed``, a :class:`~dispatch.feed.Feed`, when it has one) emitted for that very
    incarnation — its poll's, its informer's, or the answer its ``start`` got (Slurm's ``sbatch``: the
    job is queued). ``None`` when it holds none: then only a read of the cluster says."""
    feed = getattr(backend, "feed", None)
    last = feed.last(handle.ref) if isinstance(feed, Feed) else None
    if isinstance(last, Observation) and last.handle.identity.same_incarnation(handle.identity):
        return last
    return None


def known(backend: Backend, handles: Iterable[Handle]) -> bool:
    """Whether the backend's watch feed holds a current reading of every incarnation of ``handles`` (its
    :meth:`~dispatch.feed.Feed.current` says so, and it holds a reading of each: :func:`recent`): then a
    listing of the cluster would tell the host nothing the feed does not."""
    feed = getattr(backend, "feed", None)
    if not isinstance(feed, Feed) or not feed.current():
        return False
    return all(recent(backend, h) is not None for h in handles)


async def place(backend: Backend, spec: JobSpec, identity: Identity, *, held: bool = False) -> Handle:
    """Prepare, then start: place incarnation ``identity`` of a job on ``backend``'s cluster."""
    return await backend.start(await backend.prepare(spec, identity, held=held))


async def compute_gone(
    backend: Backend,
    handle: Handle,
    *,
    cessation: bool,
    listing: Callable[[], Awaitable[list[Observation]]] | None = None,
) -> bool:
    """True once no compute of incarnation ``handle`` remains: the one rule the facade and the
    supervisor both follow before they start the next incarnation.

    With ``cessation`` (the backend is a :class:`CessationSignal` and the cluster reports the
    capability) the backend says. Without, a reading says: absent, or seen with its compute gone; a
    reading that cannot tell (compute unknown) is settled by a fresh ``listing`` (default
    ``backend.list``) that no longer shows the incarnation. An unreachable cluster raises."""
    if cessation and isinstance(backend, CessationSignal):
        return await backend.ceased(handle)
    obs = await backend.observe(handle)
    if isinstance(obs, Absent) or obs.compute is Compute.GONE:
        return True
    if obs.compute is Compute.PRESENT:
        return False
    listed = await (listing() if listing is not None else backend.list())
    return not any(o.handle.identity.same_incarnation(handle.identity) for o in listed)
