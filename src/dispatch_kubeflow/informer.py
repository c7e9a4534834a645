"""One reading path: the informer of an opened cluster (SPEC §9.6 "One reading path").

An opened Kubeflow cluster keeps **one** list+watch per kind — TrainJobs, JobSets, Jobs, pods, Workloads
(Kueue installed) and the Trainer runtimes — and a cache every reader in the process shares: ``observe``,
``list``, every ``watch()`` (so every ``Cluster.watch(job_id)``), the supervisor and the runtime check of
``prepare``. This is controller-runtime's cache-backed reader fed by kopf's continuous watching
(:func:`~dispatch_kubeflow.watching.continuous_watch`): a thousand concurrent watches cost the requests one
does, and the requests and bytes per job stay constant as the number of jobs grows.

The informer starts on the first read (in the running event loop) and stops with the backend (a read-only
backend's first read is a one-time listing instead, :meth:`Informer.snapshot`). A watch of
it is a *subscription*: it is told which incarnations an event touched and folds only those, from the
shared cache, through one memo of folded outcomes (each incarnation is folded once per change, however
many subscribers read it). An incarnation whose TrainJob is deleted leaves a tombstone (the
resourceVersion of its deletion), so a subscriber resuming from a cursor learns of deletions since then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from typing import Any

from dispatch.clock import Clock
from dispatch.errors import DispatchError, NotFoundError, PermissionDeniedError
from dispatch.model import Change, Handle, Identity, Observation, Outcome
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
    encode_cursor,
    list_kind,
    newer,
)

__all__ = ["TOMBSTONES", "Informer"]

_log = logging.getLogger(__name__)

TOMBSTONES = 10_000
"""How many gone incarnations the informer remembers (bounded memory over a long-lived process)."""

Fold = Callable[[str, Parts], Outcome]
"""The observation of incarnation ``name`` from its cached parts (``parts.trainjob`` ``None``: it is gone)."""
Tails = Callable[[str, Parts], Awaitable[None]]
"""Read (and keep) what must be read before an incarnation is folded: the output tails of its failed nodes
while their pods are there, the Events of a failure nothing cached explains."""
HandleOf = Callable[[Identity, str], Handle]

_Notice = tuple[tuple[str, Outcome], ...] | DispatchError
"""What a subscriber is told: each incarnation an event touched with its observation *then* (folded once,
in the pump, so a subscriber that lags still sees every transition, not only the latest), or the error
that ended the feed."""


class Informer:
    """The shared list+watch and cache of one opened cluster (see the module docstring)."""

    def __init__(
        self,
        client: KubeClient,
        namespace: str,
        kinds: list[Kind],
        *,
        fold: Fold,
        tails: Tails,
        clock: Clock,
    ) -> None:
        self.client = client
        self.namespace = namespace
        self._all_kinds = list(kinds)
        self.kinds = list(kinds)
        self.view = View(kinds)
        self.fold = fold
        self.tails = tails
        self.clock = clock
        self.rvs: dict[str, str] = {}
        self.start_rvs: dict[str, str] = {}
        """The resourceVersions of the listing the cache started from: it saw every event after them."""
        self.tombstones: OrderedDict[str, str] = OrderedDict()
        """Incarnations whose TrainJob was deleted while followed, with the TrainJobs' resourceVersion then."""
        self._memo: dict[str, Outcome] = {}
        self._subs: dict[str | None, set[asyncio.Queue[_Notice]]] = {}
        """Subscribers by the job they follow (``None``: every job)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock: asyncio.Lock | None = None
        self._task: asyncio.Task[None] | None = None

    # --- lifecycle ---------------------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done() and self._loop is asyncio.get_running_loop()

    async def sync(self) -> None:
        """Start following the cluster unless this process already does: list every kind (a kind the
        credentials may not read, or the cluster does not serve, is left out with a warning; TrainJobs
        themselves are required), then watch each from its listing."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # a new event loop (another asyncio.run): what ran in the old one is dead
            self._loop, self._lock, self._task = loop, asyncio.Lock(), None
        if self.running:
            return
        assert self._lock is not None
        async with self._lock:
            if self.running:
                return
            self.kinds = list(self._all_kinds)
            await self._list_all()
            streams = Streams()
            for kind in self.kinds:
                streams.start(self.client, kind, self.rvs[kind.key], clock=self.clock)
            streams.tick(TICK_SECONDS, clock=self.clock)
            self._task = asyncio.ensure_future(self._pump(streams))

    async def snapshot(self, keys: Collection[str], *, enough: Callable[[View], bool] | None = None) -> None:
        """List the kinds ``keys`` once into the cache and watch nothing: the reading of a process that
        asks once (a read command) — seven watch streams opened to be closed at once cost it more than
        its answer. Nothing when the feed runs already (the cache is current); a later :meth:`sync`
        lists again and starts the feed. With ``enough``, the TrainJobs and pods are listed first and the
        other kinds only when ``enough`` says those do not suffice (:mod:`dispatch_kubeflow.plain`)."""
        if self.running:
            return
        wanted = [k for k in self._all_kinds if k.key in keys]
        if enough is not None:
            self.kinds = [k for k in wanted if k.key in FIRST]
            await self._list_all(tails=False)
            # Without pods (not readable here) the other kinds are what says a job failed: read them.
            if {k.key for k in self.kinds} >= FIRST and enough(self.view):
                await self._read_first()
                return
            rest = [k for k in wanted if k.key not in FIRST]
            self.kinds = [*self.kinds, *rest]
            await self._list_all(only=rest)
            return
        self.kinds = wanted
        await self._list_all()

    async def _list_all(self, *, only: list[Kind] | None = None, tails: bool = True) -> None:
        """List every kind followed (``only`` those), a kind the credentials may not read, or the cluster
        does not serve, left out with a warning (TrainJobs themselves are required), then read what must
        be read before the first fold of each incarnation (unless not ``tails``)."""
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
        self.start_rvs = dict(self.rvs)
        self._memo.clear()
        if tails:
            await self._read_first()

    async def _read_first(self) -> None:
        """What must be read before the first fold of each incarnation (see ``Tails``)."""
        for key in sorted(self.view.identities):
            parts = self.view.parts(key)
            if parts.trainjob is not None:
                await self.tails(key, parts)

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

    # --- the cache -----------------------------------------------------------------------------------

    def objects(self, kind: str, key: str) -> list[dict[str, Any]] | None:
        """The cached objects of ``kind`` under ``key``; ``None`` when ``kind`` is not followed."""
        if kind not in {k.key for k in self.kinds}:
            return None
        return self.view.objects(kind, key)

    def versions(self, kind: str) -> dict[str, str]:
        """uid -> resourceVersion of every cached object of ``kind`` (to tell how far the cache is)."""
        return {uid: _rv(obj) for uid, obj in self.view.all(kind).items()}

    def parts(self, key: str) -> Parts:
        return self.view.parts(key)

    def outcome(self, key: str) -> Outcome:
        """The folded observation of incarnation ``key``, folded once per change for every reader."""
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = self.fold(key, self.view.parts(key))
        return found

    def last(self, key: str) -> Outcome | None:
        """The observation of ``key`` as last folded, before the event being applied (``None``: not yet)."""
        return self._memo.get(key)

    def invalidate(self, key: str) -> None:
        """Fold ``key`` again on its next read (what the fold depends on besides the cache changed)."""
        self._memo.pop(key, None)

    def remember(self, kind: str, obj: dict[str, Any]) -> None:
        """Put an object this process just read or wrote into the cache, unless the cache already holds
        it as recent (what this process wrote is read back at once; the watch delivers the same soon)."""
        held = self.view.get(kind, obj)
        if held is not None and newer(_rv(obj), _rv(held)) is not True:
            return
        for key in self.view.apply(kind, "MODIFIED", obj):
            self._memo.pop(key, None)

    def forget_trainjob(self, name: str) -> None:
        """A TrainJob the cluster confirmed gone that the cache still holds (its deletion event is on its
        way): drop it now, so every reader agrees with the cluster."""
        for obj in self.view.objects("trainjobs", name):
            self.view.apply("trainjobs", "DELETED", obj)
        self._memo.pop(name, None)
        self._bury(name, self.rvs.get("trainjobs", ""))

    def identities(self) -> Mapping[str, Identity]:
        return self.view.identities

    def cursor(self) -> str:
        return encode_cursor(self.namespace, self.rvs)

    def _replace(
        self, kind: str, items: list[dict[str, Any]] | tuple[dict[str, Any], ...], rv: str
    ) -> set[str]:
        before = {k for k in self.view.identities if self.view.parts(k).trainjob is not None}
        affected = self.view.replace(kind, items)
        self.rvs[kind] = rv
        if kind == "trainjobs":
            for key in before:
                if self.view.parts(key).trainjob is None:
                    self._bury(key, rv)
        return affected

    def _bury(self, key: str, rv: str) -> None:
        self.tombstones.pop(key, None)
        self.tombstones[key] = rv
        while len(self.tombstones) > TOMBSTONES:
            old, _ = self.tombstones.popitem(last=False)
            self.view.identities.pop(old, None)
            self._memo.pop(old, None)

    # --- the feed --------------------------------------------------------------------------------------

    async def _pump(self, streams: Streams) -> None:
        try:
            while True:
                event = await streams.queue.get()
                affected = self._apply(event)
                # The kinds arrive on separate streams: what the others already received (a pod's last
                # status behind its TrainJob's Failed) is applied before anything is folded, so a reading
                # never pairs a new TrainJob with pods older than what this process holds.
                await asyncio.sleep(0)
                while not streams.queue.empty():
                    affected |= self._apply(streams.queue.get_nowait())
                routed: dict[str | None, list[tuple[str, Outcome]]] = {}
                for key in sorted(affected):
                    parts = self.view.parts(key)
                    if parts.trainjob is not None:
                        await self.tails(key, parts)
                    self._memo.pop(key, None)
                    identity = self.view.identities.get(key)
                    if identity is None:
                        continue
                    now = (key, self.outcome(key))
                    routed.setdefault(None, []).append(now)
                    routed.setdefault(identity.job_id, []).append(now)
                for job, items in routed.items():
                    notice = tuple(items)
                    for q in self._subs.get(job, ()):
                        q.put_nowait(notice)
        except DispatchError as exc:
            # The TrainJobs cannot be followed any more: every subscriber ends with the error, and the
            # next read lists again.
            for queues in self._subs.values():
                for q in queues:
                    q.put_nowait(exc)
        finally:
            await streams.close()

    def _apply(self, event: Event) -> set[str]:
        if event.type == "FAILED":
            assert event.error is not None
            if event.kind == "trainjobs" or not isinstance(
                event.error, PermissionDeniedError | NotFoundError
            ):
                raise event.error
            _log.warning("watch: %s; following the other kinds without it", event.error)
            self._drop(event.kind)
            return set(self.view.identities)
        if event.type == "TICK":
            return {k for k in self.view.identities if _deleting(self.view.parts(k).trainjob)}
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
                    self._bury(key, event.rv)
        return affected

    # --- subscribers -----------------------------------------------------------------------------------

    def covers(self, rvs: Mapping[str, str]) -> bool:
        """Whether this running informer saw every event after the cursor ``rvs`` (it started no later)."""
        if not self.running:
            return False
        for kind in self.kinds:
            since, started = rvs.get(kind.key), self.start_rvs.get(kind.key)
            if since is None or started is None or newer(started, since) is not False:
                return False
        return True

    async def follow(
        self, handle_of: HandleOf, since: Mapping[str, str] | None = None, *, job_id: str | None = None
    ) -> AsyncIterator[Change]:
        """Changes of every incarnation (of job ``job_id`` alone, when given): first each one's current
        observation (resuming from cursor ``since`` — which :meth:`covers` — only those changed or deleted
        after it), then every change of its observation. Ends with the error when the TrainJobs cannot be
        followed."""
        await self.sync()
        queue: asyncio.Queue[_Notice] = asyncio.Queue()
        self._subs.setdefault(job_id, set()).add(queue)
        emitted: dict[str, Outcome] = {}
        try:
            keys = {
                k for k, ident in self.view.identities.items() if job_id is None or ident.job_id == job_id
            }
            if since is not None:
                touched = self.view.touched_since(since) or set(keys)
                touched |= {
                    k for k, rv in self.tombstones.items() if newer(rv, since.get("trainjobs")) is not False
                }
                for key in keys - touched:
                    emitted[key] = self.outcome(key)  # the host saw it before the cursor
                keys &= touched
            for key in sorted(keys):
                change = self._change(key, self.outcome(key), emitted, handle_of)
                if change is not None:
                    yield change
            while True:
                notice = await queue.get()
                if isinstance(notice, DispatchError):
                    raise notice
                for key, outcome in notice:
                    change = self._change(key, outcome, emitted, handle_of)
                    if change is not None:
                        yield change
        finally:
            subs = self._subs.get(job_id)
            if subs is not None:
                subs.discard(queue)
                if not subs:
                    del self._subs[job_id]

    def _change(
        self, key: str, outcome: Outcome, emitted: dict[str, Outcome], handle_of: HandleOf
    ) -> Change | None:
        identity = self.view.identities.get(key)
        if identity is None:
            return None
        last = emitted.get(key)
        if last is outcome or last == outcome:
            return None
        emitted[key] = outcome
        return Change(Observation(handle_of(identity, key), outcome, self.clock.now()), self.cursor())


def _rv(obj: Mapping[str, Any]) -> str:
    rv = meta_of(obj).get("resourceVersion")
    return rv if isinstance(rv, str) else ""


def _deleting(obj: Mapping[str, Any] | None) -> bool:
    return bool(meta_of(obj).get("deletionTimestamp"))
