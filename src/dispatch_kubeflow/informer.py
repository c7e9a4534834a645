"""One reading path: the informer of an opened cluster (SPEC §9.6 "One reading path").

An opened Kubeflow cluster keeps **one** list+watch per kind — TrainJobs, JobSets, Jobs, pods, Workloads
(Kueue installed) and the Trainer runtimes — and one cache every reader in the process shares: ``observe``,
``list``, the host's feed (every ``watch``, so every ``Cluster.watch(job_id)``), the supervisor and the
runtime check of ``prepare``. This is controller-runtime's cache-backed reader fed by kopf's continuous
watching (:func:`~dispatch_kubeflow.watching.continuous_watch`): a thousand concurrent watches cost the
requests one does, and the requests and bytes per job stay constant as the number of jobs grows.

The informer starts on the first read (in the running event loop) and stops with the backend (a read-only
backend's first read is a one-time listing instead, :meth:`Informer.snapshot`). After each batch of events
it tells the backend which incarnations changed (``on_change``), which reads them into the host's feed
(:class:`dispatch.feed.Feed`): the feed, not the informer, remembers what was emitted. What the adapter
reads beside the objects — a failed node's output tail while its pod is there, the Events of a failure
nothing cached explains, when a deletion was first seen — is kept here too, per incarnation
(:class:`Extras`), and goes with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from msgspec import Struct, field

from dispatch.clock import Clock
from dispatch.errors import (
    DispatchError,
    NotFoundError,
    OutcomeUnknownError,
    PermissionDeniedError,
    UnavailableError,
)
from dispatch.model import Identity, Unreachable
from dispatch_kubeflow.incarnation import DeletionClock
from dispatch_kubeflow.kube import KubeClient
from dispatch_kubeflow.objects import meta_of
from dispatch_kubeflow.plain import FIRST
from dispatch_kubeflow.watching import (
    TICK_SECONDS,
    Event,
    Kind,
    Parts,
    Streams,
    View,
    list_kind,
    newer,
)

__all__ = ["GONE", "Extras", "Informer"]

_log = logging.getLogger(__name__)

GONE = 10_000
"""How many gone incarnations the informer remembers (bounded memory over a long-lived process)."""

OnChange = Callable[[str, Identity], Awaitable[None]]
"""Called with each incarnation (its TrainJob's name and identity) a batch of events touched."""
OnTrouble = Callable[[Unreachable | None], None]
"""Called when the cluster stops answering the informer (since when, and why), and again (``None``) once
everything that failed has answered."""


class Extras(Struct):
    """What the adapter read about one incarnation beside its objects (see the module docstring)."""

    tails: dict[str, Any] = field(default_factory=dict)
    """Output tails of failed nodes, by pod name (read while the pod was there)."""
    tails_read: set[tuple[str, str]] = field(default_factory=set)
    """(pod uid, container id) of each failed container run already read."""
    events: list[dict[str, Any]] | None = None
    """The Events of its objects, read once for a failure nothing cached explains."""


class Informer:
    """The shared list+watch and cache of one opened cluster (see the module docstring)."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        kinds: list[Kind],
        *,
        on_change: OnChange,
        clock: Clock,
        on_trouble: OnTrouble | None = None,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self._all_kinds = list(kinds)
        self.kinds = list(kinds)
        self.view = View(kinds)
        self.on_change = on_change
        self.on_trouble = on_trouble
        self.clock = clock
        self._failing: dict[str, str] = {}
        """What could not read the cluster at its last attempt (a kind's watch, the listing) -> why."""
        self._troubled_since: float | None = None
        self.rvs: dict[str, str] = {}
        self.listed_at: dict[str, float] = {}
        """When (``time.monotonic``) each kind was last listed whole: how old a snapshot's objects are."""
        self._gone: OrderedDict[str, None] = OrderedDict()
        """Incarnations whose TrainJob was deleted while followed (their identities are kept, bounded)."""
        self._extras: dict[str, Extras] = {}
        self.deletions = DeletionClock()
        """When this process first saw each deletion under way (a deletion that does not complete)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._task: asyncio.Task[None] | None = None
        self._streams: Streams | None = None
        self._busy = False
        self._started: asyncio.Event = asyncio.Event()

    # --- lifecycle ---------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and self._loop is asyncio.get_running_loop()

    @property
    def quiet(self) -> bool:
        """Whether every event received so far has been applied and read into the feed (nothing queued,
        nothing being read): a test that waits for the cache to catch up waits for this too."""
        streams = self._streams
        return not self._busy and (streams is None or streams.queue.empty())

    async def sync(self) -> None:
        """Start following the cluster unless this process already does: list every kind (a kind the
        credentials may not read, or the cluster does not serve, is left out with a warning; TrainJobs
        themselves are required), tell the backend of every incarnation, then watch each kind from its
        listing."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (another asyncio.run): what ran in the old one is dead
            self._loop, self._lock, self._task = loop, asyncio.Lock(), None
            self._started = asyncio.Event()
        if self.running:
            return
        assert self._lock is not None
        async with self._lock:
            if self.running:
                return
            self.kinds = list(self._all_kinds)
            try:
                await self._list_all()
            except (UnavailableError, OutcomeUnknownError) as exc:
                self._trouble("list", exc)
                raise
            self._answered_all()  # a fresh listing: what failed before (the old streams) is behind it
            streams = Streams()
            for kind in self.kinds:
                streams.start(self.client, kind, self.rvs[kind.key], clock=self.clock)
            streams.tick(TICK_SECONDS, clock=self.clock)
            self._streams = streams
            self._task = asyncio.ensure_future(self._pump(streams))
            # Its error is the feed's to raise (done()) and the next read's to restart from; with no feed
            # waiting it is still retrieved here, not reported as "never retrieved" at exit.
            self._task.add_done_callback(_retrieved)
            for key in sorted(self.view.identities):
                await self.on_change(key, self.view.identities[key])
            self._started.set()

    async def following(self) -> None:
        """Wait until this process follows the cluster (someone's :meth:`sync` started the watch), without
        starting it: a background task that waits here sends nothing of its own."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._lock, self._task = loop, asyncio.Lock(), None
            self._started = asyncio.Event()
        while not self.running:
            self._started.clear()
            await self._started.wait()

    async def done(self) -> None:
        """Wait until the watch ends: raises the error that ended it (the TrainJobs cannot be followed)."""
        task = self._task
        if task is None:
            return
        await asyncio.shield(task)

    async def snapshot(self, keys: Collection[str], *, enough: Callable[[View], bool] | None = None) -> None:
        """List the kinds ``keys`` once into the cache and watch nothing: the reading of a process that
        asks once (a read command) — seven watch streams opened to be closed at once cost it more than
        its answer. Nothing when the watch runs already (the cache is current); a later :meth:`sync`
        lists again and starts it. With ``enough``, the TrainJobs and pods are listed first and the
        other kinds only when ``enough`` says those do not suffice (:mod:`dispatch_kubeflow.plain`)."""
        if self.running:
            return
        wanted = [k for k in self._all_kinds if k.key in keys]
        if enough is not None:
            self.kinds = [k for k in wanted if k.key in FIRST]
            await self._list_all()
            # Without pods (not readable here) the other kinds are what says a job failed: read them.
            if {k.key for k in self.kinds} >= FIRST and enough(self.view):
                return
            rest = [k for k in wanted if k.key not in FIRST]
            self.kinds = [*self.kinds, *rest]
            await self._list_all(only=rest)
            return
        self.kinds = wanted
        await self._list_all()

    async def _list_all(self, *, only: list[Kind] | None = None) -> None:
        """List every kind followed (``only`` those), a kind the credentials may not read, or the cluster
        does not serve, left out with a warning (TrainJobs themselves are required)."""
        for kind in list(self.kinds if only is None else only):
            try:
                items, rv = await list_kind(self.client, kind)
            except (PermissionDeniedError, NotFoundError) as exc:
                if kind.key == "trainjobs":
                    raise
                _log.warning("watch: %s; following the other kinds without it", exc)
                self._drop(kind.key)
                continue
            self._replace(kind.key, items, rv)
            self.listed_at[kind.key] = time.monotonic()

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is None or task.done():
            return
        loop = task.get_loop()
        if loop is asyncio.get_running_loop():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        elif not loop.is_closed():  # started on another event loop (a test's module-scoped fixture)
            loop.call_soon_threadsafe(task.cancel)

    def _drop(self, kind: str) -> None:
        self.kinds = [k for k in self.kinds if k.key != kind]
        self.view.replace(kind, ())
        self.rvs.pop(kind, None)
        self._trouble(kind, None)  # not followed: whether its watch answers says nothing any more

    # --- whether the cluster answers -------------------------------------------------------------------

    def _trouble(self, what: str, error: DispatchError | None) -> None:
        """``what`` (a kind's watch, the listing) could not read the cluster (``error``), or answered
        (``None``); ``on_trouble`` is told since when the cluster has not answered and why, at every
        failure, and once when everything that failed answered again. The cache still answers reads
        meanwhile (controller-runtime's does too): it is the daemon's readiness that must know."""
        if error is None:
            if self._failing.pop(what, None) is None:
                return
        else:
            self._failing[what] = str(error) or type(error).__name__
        if not self._failing:
            self._troubled_since = None
            if self.on_trouble is not None:
                self.on_trouble(None)
            return
        if self._troubled_since is None:
            self._troubled_since = self.clock.now()
        if self.on_trouble is not None:
            first = self._failing[min(self._failing)]
            more = len(self._failing) - 1
            self.on_trouble(
                Unreachable(self._troubled_since, first + (f" (and {more} more)" if more else ""))
            )

    def _answered_all(self) -> None:
        for what in list(self._failing):
            self._trouble(what, None)

    # --- the cache -----------------------------------------------------------------------------------

    def follows(self, kind: str) -> bool:
        """Whether ``kind`` is followed (listed, and watched while the informer runs)."""
        return kind in {k.key for k in self.kinds}

    def objects(self, kind: str, key: str) -> list[dict[str, Any]] | None:
        """The cached objects of ``kind`` under ``key``; ``None`` when ``kind`` is not followed."""
        if not self.follows(kind):
            return None
        return self.view.objects(kind, key)

    def versions(self, kind: str) -> dict[str, str]:
        """uid -> resourceVersion of every cached object of ``kind`` (to tell how far the cache is)."""
        return {uid: _rv(obj) for uid, obj in self.view.all(kind).items()}

    def parts(self, key: str) -> Parts:
        return self.view.parts(key)

    def extras(self, key: str) -> Extras:
        """What the adapter read about incarnation ``key`` beside its objects (kept while it is known)."""
        found = self._extras.get(key)
        if found is None:
            found = self._extras[key] = Extras()
        return found

    def remember(self, kind: str, obj: dict[str, Any]) -> None:
        """Put an object this process just read or wrote into the cache, unless the cache already holds
        it as recent (what this process wrote is read back at once; the watch delivers the same soon)."""
        held = self.view.get(kind, obj)
        if held is not None and newer(_rv(obj), _rv(held)) is not True:
            return
        self.view.apply(kind, "MODIFIED", obj)

    def forget_trainjob(self, name: str) -> None:
        """A TrainJob the cluster confirmed gone that the cache still holds (its deletion event is on its
        way): drop it now, so every reader agrees with the cluster."""
        for obj in self.view.objects("trainjobs", name):
            self.view.apply("trainjobs", "DELETED", obj)
        self._bury(name)

    def identities(self) -> Mapping[str, Identity]:
        return self.view.identities

    def _replace(
        self, kind: str, items: list[dict[str, Any]] | tuple[dict[str, Any], ...], rv: str
    ) -> set[str]:
        before = {k for k in self.view.identities if self.view.parts(k).trainjob is not None}
        affected = self.view.replace(kind, items)
        self.rvs[kind] = rv
        if kind == "trainjobs":
            for key in before:
                if self.view.parts(key).trainjob is None:
                    self._bury(key)
        return affected

    def _bury(self, key: str) -> None:
        self._gone.pop(key, None)
        self._gone[key] = None
        while len(self._gone) > GONE:
            old, _ = self._gone.popitem(last=False)
            if self.view.parts(old).empty:
                self.view.identities.pop(old, None)
                self._extras.pop(old, None)

    # --- the watch -----------------------------------------------------------------------------------

    async def _pump(self, streams: Streams) -> None:
        try:
            while True:
                event = await streams.queue.get()
                self._busy = True
                affected = self._apply(event)
                # The kinds arrive on separate streams: what the others already received (a pod's last
                # status behind its TrainJob's Failed) is applied before anything is read, so a reading
                # never pairs a new TrainJob with pods older than what this process holds.
                await asyncio.sleep(0)
                while not streams.queue.empty():
                    affected |= self._apply(streams.queue.get_nowait())
                for key in sorted(affected):
                    identity = self.view.identities.get(key)
                    if identity is not None:
                        await self.on_change(key, identity)
                self._busy = False
        finally:
            self._busy = False
            await streams.close()

    def _apply(self, event: Event) -> set[str]:
        if event.type == "FAILED":
            assert event.error is not None
            if event.kind == "trainjobs" or not isinstance(
                event.error, PermissionDeniedError | NotFoundError
            ):
                raise event.error  # the TrainJobs cannot be followed: the feed's source ends with it
            _log.warning("watch: %s; following the other kinds without it", event.error)
            self._drop(event.kind)
            return set(self.view.identities)
        if event.type in ("TROUBLE", "ANSWERED"):
            self._trouble(event.kind, event.error if event.type == "TROUBLE" else None)
            return set()
        if event.type == "TICK":
            # Readings that depend on time alone (a deletion that does not complete, a grace period).
            return {k for k in self.view.identities if not self.view.parts(k).empty}
        if event.type == "BOOKMARK":
            self.rvs[event.kind] = event.rv
            return set()
        if event.type == "RELIST":
            return self._replace(event.kind, list(event.items), event.rv)
        affected = self.view.apply(event.kind, event.type, event.obj)
        self.rvs[event.kind] = event.rv
        if event.kind == "trainjobs" and event.type == "DELETED":
            for key in affected:
                if self.view.parts(key).trainjob is None:
                    self._bury(key)
        return affected


def _rv(obj: Mapping[str, Any]) -> str:
    rv = meta_of(obj).get("resourceVersion")
    return rv if isinstance(rv, str) else ""


def _retrieved(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        error = task.exception()
        if error is not None:
            _log.info("the watch of the cluster ended: %s", error)
