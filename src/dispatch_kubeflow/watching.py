"""The watch streams: one list+watch per kind, and the view that indexes what they bring by incarnation
(SPEC §9.6).

Kinds: TrainJobs, JobSets, Jobs, pods and (when Kueue is installed) Workloads, each listed and then watched
from the list's resourceVersion — one stream per kind for every job at once, never one request per job,
never polling (the model is kopf's ``continuous_watch``). Every change of an object touches the one
incarnation it belongs to (:class:`View`); the informer (:mod:`dispatch_kubeflow.informer`) reads that
incarnation again into the host's feed, which emits a change only when the reading differs. A stream that
ends or drops is resumed from its last resourceVersion (bookmarks advance it); ``410 Expired`` relists the
kind; 429/5xx and lost connections are retried with doubling backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from msgspec import Struct, field

from dispatch import metrics
from dispatch.clock import Clock
from dispatch.errors import (
    ConflictError,
    DispatchError,
    OutcomeUnknownError,
    UnavailableError,
)
from dispatch.model import Identity
from dispatch_kubeflow import naming
from dispatch_kubeflow.errors import ExpiredError, map_status
from dispatch_kubeflow.kube import BadWatchEvent, KubeClient
from dispatch_kubeflow.names import (
    LABEL_JOB_HASH,
    LABEL_JOBSET_NAME,
    LABEL_MANAGED_BY,
    LABEL_STORE,
    MANAGED_BY,
)
from dispatch_kubeflow.objects import as_map, labels_of, meta_of
from dispatch_kubeflow.resources import (
    CLUSTER_TRAINING_RUNTIMES,
    JOBS,
    JOBSETS,
    LABEL_JOB_UID,
    PODS,
    TRAINING_RUNTIMES,
    TRAINJOBS,
    WORKLOADS,
)

__all__ = [
    "DISPATCH_SELECTOR",
    "Event",
    "Kind",
    "Parts",
    "Streams",
    "View",
    "continuous_watch",
    "kinds",
    "list_kind",
    "newer",
    "runtime_kind_key",
    "runtime_kinds",
    "selector",
]

_log = logging.getLogger(__name__)

DISPATCH_SELECTOR = f"{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_JOB_HASH}"
"""Selects what dispatch created for a job (the probe carries no job hash)."""
TICK_SECONDS = 60.0
"""How often readings that depend on time alone are re-folded (no request is sent for it)."""
WATCH_SECONDS = 290
"""``timeoutSeconds`` of one watch request: the server ends it, and it is resumed from its resourceVersion."""


def _name_key(obj: Mapping[str, Any]) -> str | None:
    name = meta_of(obj).get("name")
    return name if isinstance(name, str) and name else None


def _jobset_key(obj: Mapping[str, Any]) -> str | None:
    name = labels_of(obj).get(LABEL_JOBSET_NAME)
    return name if isinstance(name, str) and name else None


def _owner_key(obj: Mapping[str, Any]) -> str | None:
    refs = meta_of(obj).get("ownerReferences")
    for ref in refs if isinstance(refs, list) else []:
        ref = as_map(ref)
        if ref.get("kind") == "TrainJob" and isinstance(ref.get("name"), str):
            return str(ref["name"])
    return None


class Kind(Struct, frozen=True):
    """One watched collection: its cursor ``key``, REST ``path``, label ``selector`` and how an object of it
    names the incarnation it belongs to (``key_of``: the TrainJob's name, or ``None`` for none of ours)."""

    key: str
    path: str
    selector: str | None
    key_of: Callable[[Mapping[str, Any]], str | None]


def selector(store: str = "") -> str:
    """What dispatch created for a job; with a store identity, only what that store's host created."""
    return f"{DISPATCH_SELECTOR},{LABEL_STORE}={store}" if store else DISPATCH_SELECTOR


def kinds(namespace: str, *, kueue: bool, pods: bool = True, store: str = "") -> list[Kind]:
    """The kinds the watch follows in ``namespace``. JobSets, Jobs and pods carry dispatch's identity labels
    (the adapter's runtime patch puts them on the JobSet, Job and pod templates); a Kueue Workload carries
    only Kueue's ``job-uid`` label, so every Workload of the namespace is followed and matched by its owner."""
    mine = selector(store)
    out = [
        Kind("trainjobs", TRAINJOBS.path(namespace), mine, _name_key),
        Kind("jobsets", JOBSETS.path(namespace), mine, _name_key),
        Kind("jobs", JOBS.path(namespace), mine, _jobset_key),
    ]
    if pods:
        out.append(Kind("pods", PODS.path(namespace), mine, _jobset_key))
    if kueue:
        out.append(Kind("workloads", WORKLOADS.path(namespace), LABEL_JOB_UID, _owner_key))
    return out


RUNTIME_KINDS = {
    "ClusterTrainingRuntime": "clustertrainingruntimes",
    "TrainingRuntime": "trainingruntimes",
}
"""The cache key of each runtime kind."""


def runtime_kinds(namespace: str) -> list[Kind]:
    """The Trainer runtimes, cached so that ``prepare`` reads no runtime per submit (keyed by name)."""
    return [
        Kind(RUNTIME_KINDS["ClusterTrainingRuntime"], CLUSTER_TRAINING_RUNTIMES.path(), None, _name_key),
        Kind(RUNTIME_KINDS["TrainingRuntime"], TRAINING_RUNTIMES.path(namespace), None, _name_key),
    ]


def runtime_kind_key(kind: str) -> str:
    """The cache key of runtime kind ``kind`` (``ClusterTrainingRuntime`` or ``TrainingRuntime``)."""
    return RUNTIME_KINDS.get(kind, "")


def _rv_int(value: Any) -> int | None:
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def newer(rv: Any, than: Any) -> bool | None:
    """Whether resourceVersion ``rv`` is later than ``than``; ``None`` when they cannot be compared.

    resourceVersions are opaque by contract; every API server backed by etcd (and kubesim) makes them
    increasing integers, and only the resume-from-cursor shortcut relies on it — without it a resume
    simply emits every incarnation's current observation."""
    a, b = _rv_int(rv), _rv_int(than)
    if a is None or b is None:
        return None
    return a > b


# --- the folded view ----------------------------------------------------------------------------


class Parts(Struct):
    """The cached objects of one incarnation (keyed by its TrainJob's name)."""

    trainjob: dict[str, Any] | None = None
    jobset: dict[str, Any] | None = None
    jobs: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    workload: dict[str, Any] | None = None

    @property
    def empty(self) -> bool:
        return self.trainjob is None and self.jobset is None and not self.jobs and not self.pods


class View:
    """Every watched object, indexed by the incarnation it belongs to (pure bookkeeping, no I/O)."""

    def __init__(self, kinds: Iterable[Kind]) -> None:
        self.kinds = {k.key: k for k in kinds}
        self._objects: dict[str, dict[str, dict[str, Any]]] = {
            k: {} for k in self.kinds
        }  # kind -> uid -> obj
        self._index: dict[str, dict[str, set[str]]] = {k: {} for k in self.kinds}  # kind -> key -> uids
        self._key_of_uid: dict[str, dict[str, str]] = {k: {} for k in self.kinds}
        self.identities: dict[str, Identity] = {}

    def __len__(self) -> int:
        return sum(len(v) for v in self._objects.values())

    @staticmethod
    def uid(obj: Mapping[str, Any]) -> str | None:
        meta = meta_of(obj)
        uid = meta.get("uid") or (
            f"{meta.get('namespace', '')}/{meta.get('name', '')}" if meta.get("name") else None
        )
        return uid if isinstance(uid, str) else None

    def get(self, kind: str, obj: Mapping[str, Any]) -> dict[str, Any] | None:
        uid = self.uid(obj)
        return self._objects[kind].get(uid) if uid is not None else None

    def _remove(self, kind: str, uid: str) -> str | None:
        self._objects[kind].pop(uid, None)
        key = self._key_of_uid[kind].pop(uid, None)
        if key is not None:
            uids = self._index[kind].get(key)
            if uids is not None:
                uids.discard(uid)
                if not uids:
                    del self._index[kind][key]
        return key

    def _put(self, kind: str, obj: dict[str, Any]) -> set[str]:
        uid = self.uid(obj)
        if uid is None:
            return set()
        affected = set()
        old = self._remove(kind, uid)
        if old is not None:
            affected.add(old)
        key = self.kinds[kind].key_of(obj)
        if key is None:
            return affected
        self._objects[kind][uid] = obj
        self._key_of_uid[kind][uid] = key
        self._index[kind].setdefault(key, set()).add(uid)
        affected.add(key)
        if kind == "trainjobs":
            self._learn(key, obj)
        return affected

    def _learn(self, key: str, obj: Mapping[str, Any]) -> None:
        try:
            identity = naming.identity_of(obj)
        except ConflictError as exc:
            _log.warning("watch: ignoring a TrainJob with inconsistent dispatch marks: %s", exc)
            return
        if identity is not None:
            self.identities[key] = identity

    def apply(self, kind: str, event_type: str, obj: dict[str, Any]) -> set[str]:
        """Apply one watch event; the incarnations it touched."""
        if event_type == "DELETED":
            uid = self.uid(obj)
            if uid is None:
                return set()
            key = self._remove(kind, uid)
            if key is None:
                key = self.kinds[kind].key_of(obj)
                if kind == "trainjobs" and key is not None and key not in self.identities:
                    self._learn(key, obj)
            return {key} if key is not None else set()
        return self._put(kind, obj)

    def replace(self, kind: str, items: Iterable[dict[str, Any]]) -> set[str]:
        """Replace every object of ``kind`` with a fresh listing; the incarnations that may have changed."""
        affected = set(self._index[kind])
        for uid in list(self._objects[kind]):
            self._remove(kind, uid)
        for obj in items:
            affected |= self._put(kind, obj)
        return affected

    def keys(self) -> set[str]:
        """Every incarnation known by a TrainJob, now or before."""
        return set(self.identities)

    def all(self, kind: str) -> Mapping[str, dict[str, Any]]:
        """Every object of ``kind`` by uid."""
        return self._objects.get(kind, {})

    def objects(self, kind: str, key: str) -> list[dict[str, Any]]:
        return [self._objects[kind][u] for u in sorted(self._index[kind].get(key, ()))]

    def parts(self, key: str) -> Parts:
        """The objects of incarnation ``key``: a JobSet or Workload is taken only when it is owned by the
        TrainJob now cached (a leftover of an earlier TrainJob of the same name is not its)."""
        tjs = self.objects("trainjobs", key) if "trainjobs" in self.kinds else []
        tj = tjs[0] if tjs else None
        uid = str(meta_of(tj).get("uid", "")) if tj is not None else ""
        out = Parts(trainjob=tj)
        for js in self.objects("jobsets", key) if "jobsets" in self.kinds else []:
            if _owned_by(js, uid):
                out.jobset = js
        out.jobs = self.objects("jobs", key) if "jobs" in self.kinds else []
        out.pods = self.objects("pods", key) if "pods" in self.kinds else []
        for wl in self.objects("workloads", key) if "workloads" in self.kinds else []:
            if _owned_by(wl, uid):
                out.workload = wl
        return out

    def forget(self, key: str) -> None:
        """Drop an incarnation whose objects are all gone (bounded memory over a long watch)."""
        if self.parts(key).empty:
            self.identities.pop(key, None)

    def touched_since(self, rvs: Mapping[str, str]) -> set[str] | None:
        """Incarnations with an object changed after the cursor's resourceVersions; ``None`` when that
        cannot be decided (a kind missing from the cursor, resourceVersions that are not comparable)."""
        out: set[str] = set()
        for kind, objects in self._objects.items():
            since = rvs.get(kind)
            if since is None:
                return None
            for uid, obj in objects.items():
                later = newer(meta_of(obj).get("resourceVersion"), since)
                if later is None:
                    return None
                if later:
                    out.add(self._key_of_uid[kind][uid])
        return out


def _deleting(obj: Mapping[str, Any] | None) -> bool:
    return obj is not None and bool(meta_of(obj).get("deletionTimestamp"))


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    refs = meta_of(obj).get("ownerReferences")
    owners = (
        {str(as_map(r).get("uid")) for r in refs if as_map(r).get("uid")} if isinstance(refs, list) else set()
    )
    return not owners or not uid or uid in owners


# --- the streams ----------------------------------------------------------------------------------


class Event(Struct, frozen=True):
    """What a kind's stream hands the fold: an object event, a bookmark, a relist, or a failure — the
    last one it gave up on (``FAILED``), or one it will retry (``TROUBLE``: the cluster did not answer,
    until an ``ANSWERED``: a watch it accepted, a listing it gave)."""

    kind: str
    type: str  # ADDED | MODIFIED | DELETED | BOOKMARK | RELIST | FAILED | TICK | TROUBLE | ANSWERED
    obj: dict[str, Any] = field(default_factory=dict)
    rv: str = ""
    items: tuple[dict[str, Any], ...] = ()
    error: DispatchError | None = None


class _Expired(Exception):
    """The stream's resourceVersion is gone from the server's history (410)."""


class _Resync(Exception):
    """The stream sent something that is not a watch event: its position cannot be trusted."""


async def list_kind(client: KubeClient, kind: Kind) -> tuple[list[dict[str, Any]], str]:
    """List ``kind`` (its items and the list's resourceVersion), raising dispatch's errors."""
    params = {"labelSelector": kind.selector} if kind.selector else {}
    out = await client.request("GET", kind.path, what=f"list {kind.key}", params=params)
    out = out if isinstance(out, dict) else {}
    items = out.get("items")
    rv = meta_of(out).get("resourceVersion")
    return (
        [i for i in items if isinstance(i, dict)] if isinstance(items, list) else [],
        rv if isinstance(rv, str) else "",
    )


def _parse_event(etype: str, obj: dict[str, Any], what: str = "watch") -> tuple[str, dict[str, Any]]:
    """A decoded watch event checked: an ``ERROR`` raises (410: relist), an unknown shape resyncs."""
    if etype == "ERROR":
        code = obj.get("code")
        if code == 410:
            raise _Expired(str(obj.get("message", "")))
        raise map_status(code if isinstance(code, int) else 500, obj, what=what)
    if etype not in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK") or not isinstance(obj.get("metadata"), dict):
        raise _Resync(f"a watch event of unknown shape: type {etype!r}")
    return etype, obj


async def continuous_watch(
    client: KubeClient,
    kind: Kind,
    rv: str,
    put: Callable[[Event], None],
    *,
    clock: Clock,
    max_failures: int = 10,
) -> None:
    """Follow ``kind`` from resourceVersion ``rv`` forever, handing every event to ``put``.

    A stream that ends (the server's timeout, a dropped connection) is reopened from the last
    resourceVersion seen (events or bookmarks); ``410 Expired`` (or a corrupt stream) relists the kind and
    hands over the fresh listing; 429/5xx and lost connections back off, doubling; after ``max_failures``
    failures in a row — or at once for an answer no retry can fix (403, 404) — a ``FAILED`` event carries
    the error and the watch of this kind ends. Each failure it retries is handed over at once
    (``TROUBLE``), and the next answer after one (``ANSWERED``): whoever reads the cache knows whether the
    cluster behind it answers, without waiting for the retries to run out."""
    failures = 0
    retry = client.retry
    what = f"watch {kind.key}"
    troubled = False

    def answered() -> None:
        nonlocal troubled
        if troubled:
            troubled = False
            put(Event(kind.key, "ANSWERED"))

    while True:
        params = {
            "watch": "1",
            "allowWatchBookmarks": "true",
            "resourceVersion": rv,
            "timeoutSeconds": str(WATCH_SECONDS),
        }
        if kind.selector:
            params["labelSelector"] = kind.selector
        try:
            try:
                async for etype, obj in client.watch(
                    kind.path, what=what, params=params, read_timeout=WATCH_SECONDS + 30.0, opened=answered
                ):
                    etype, obj = _parse_event(etype, obj, what)
                    failures = 0
                    new_rv = obj["metadata"].get("resourceVersion")
                    if isinstance(new_rv, str) and new_rv:
                        rv = new_rv
                    if etype == "BOOKMARK":
                        put(Event(kind.key, "BOOKMARK", rv=rv))
                    else:
                        put(Event(kind.key, etype, obj, rv=rv))
                failures = 0  # a stream that ended normally: reopen from where it was
                metrics.current().inc("dispatch_watch_restarts_total", {"kind": kind.key, "reason": "ended"})
                continue
            except (_Expired, _Resync, BadWatchEvent, ExpiredError) as exc:
                _log.info("%s: %s; listing again", what, exc)
                metrics.current().inc("dispatch_watch_relists_total", {"kind": kind.key})
                items, rv = await list_kind(client, kind)
                answered()
                put(Event(kind.key, "RELIST", rv=rv, items=tuple(items)))
                failures = 0
                continue
        except (UnavailableError, OutcomeUnknownError) as exc:
            error: DispatchError = exc  # 429/5xx answers, lost connections: back off and resume
        except DispatchError as exc:  # 403, 404, ...: no retry fixes it
            put(Event(kind.key, "FAILED", error=exc))
            return
        failures += 1
        troubled = True
        put(Event(kind.key, "TROUBLE", error=error))
        metrics.current().inc("dispatch_watch_restarts_total", {"kind": kind.key, "reason": "error"})
        if failures >= max_failures:
            put(
                Event(
                    kind.key,
                    "FAILED",
                    error=UnavailableError(f"{error} (watch gave up after {failures} tries)"),
                )
            )
            return
        _log.debug("%s: %s; retrying (%d)", what, error, failures)
        await clock.sleep(retry.delay(failures - 1))


class Streams:
    """The running per-kind watches of one ``watch()`` call, feeding one queue."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self, client: KubeClient, kind: Kind, rv: str, *, clock: Clock) -> None:
        self._tasks.append(
            asyncio.ensure_future(continuous_watch(client, kind, rv, self.queue.put_nowait, clock=clock))
        )

    def tick(self, every: float, *, clock: Clock) -> None:
        """A ``TICK`` event every ``every`` seconds: readings that depend on time (a deletion that does not
        complete) are re-folded without any request."""

        async def ticker() -> None:
            while True:
                await clock.sleep(every)
                self.queue.put_nowait(Event("", "TICK"))

        self._tasks.append(asyncio.ensure_future(ticker()))

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
