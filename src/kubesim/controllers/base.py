"""The shape shared by kubesim's controllers: a de-duplicating work queue fed by store events, timers
for "reconcile again at time T", and small helpers to write only what changed and to record Events.

Controllers run synchronously inside ``Simulator.settle()``: a store event only enqueues a key; work is
done in ``run_once``. A reconcile must be idempotent (the store drops no-op writes, so a settled system
stops producing events).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kubesim.clock import Clock, TimerHandle, stamp
from kubesim.errors import ApiError
from kubesim.resources import ResourceType

if TYPE_CHECKING:
    from kubesim.store import ObjectStore, WatchEvent

__all__ = ["BaseController", "Key"]

log = logging.getLogger("kubesim.controllers")

Key = tuple[str, str]  # (namespace or "", name)


class BaseController:
    """A controller with a key queue; subclasses implement ``keys_for`` and ``reconcile``."""

    name = "base"
    #: kinds kept in a read-only local cache fed by store events (an informer, as real controllers use)
    cached_kinds: tuple[ResourceType, ...] = ()

    def __init__(self) -> None:
        self._cache: dict[ResourceType, dict[Key, dict[str, Any]]] = {}
        self._owned: dict[ResourceType, dict[str, dict[Key, dict[str, Any]]]] = {}
        self._queue: dict[Key, None] = {}
        self._timers: dict[Key, tuple[float, TimerHandle]] = {}
        self._deferred: list[tuple[float, Key]] = []
        self.sim: Any = None
        self._unsubscribe: Any = None
        self.errors: list[str] = []  # unexpected failures, kept for debugging (never raised into the sim)

    # ---------------------------------------------------------------------------------- wiring

    @property
    def store(self) -> ObjectStore:
        return self.sim.store  # type: ignore[no-any-return]

    @property
    def clock(self) -> Clock:
        return self.sim.clock  # type: ignore[no-any-return]

    def now(self) -> str:
        return stamp(self.clock, self.clock.now())

    def attach(self, sim: Any) -> None:
        """Subscribe to the simulator's store and register admission hooks (``setup``)."""
        self.sim = sim
        for rt in self.cached_kinds:
            self._cache[rt] = {}
            self._owned[rt] = {}
            for obj in sim.store.list(rt)[0]:
                self._cache_put(rt, obj, None)
        self._unsubscribe = sim.store.subscribe(self._on_event)
        self.setup()
        self.resync()

    def setup(self) -> None:
        """Register admission hooks and the like (override)."""

    def resync(self) -> None:
        """Enqueue existing objects once at attach time (override)."""

    def keys_for(self, ev: WatchEvent) -> Iterable[Key]:
        """Which keys an event concerns (override)."""
        return ()

    def reconcile(self, namespace: str, name: str) -> None:
        """Bring the world in line for one key (override)."""

    # ---------------------------------------------------------------------------------- queue

    def _on_event(self, ev: WatchEvent) -> None:
        if ev.rt in self._cache:
            if ev.type == "DELETED":
                self._cache_drop(ev.rt, ev.obj)
            else:
                self._cache_put(ev.rt, ev.obj, ev.old)
        for key in self.keys_for(ev):
            self._queue[key] = None

    @staticmethod
    def _key_of(obj: dict[str, Any]) -> Key:
        meta = obj["metadata"]
        return (meta.get("namespace") or "", meta["name"])

    def _cache_put(self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        key = self._key_of(obj)
        if old is not None:
            self._cache_drop(rt, old)
        self._cache[rt][key] = obj
        ref = controller_of(obj)
        if ref is not None:
            self._owned[rt].setdefault(str(ref.get("uid")), {})[key] = obj

    def _cache_drop(self, rt: ResourceType, obj: dict[str, Any]) -> None:
        key = self._key_of(obj)
        self._cache[rt].pop(key, None)
        ref = controller_of(obj)
        if ref is not None:
            owned = self._owned[rt].get(str(ref.get("uid")))
            if owned is not None:
                owned.pop(key, None)
                if not owned:
                    del self._owned[rt][str(ref.get("uid"))]

    def cached(self, rt: ResourceType, namespace: str | None = None) -> list[dict[str, Any]]:
        """Cached objects of ``rt`` (read-only: copy before changing), optionally of one namespace."""
        objs = self._cache[rt].values()
        if namespace is None:
            return list(objs)
        return [o for o in objs if (o["metadata"].get("namespace") or "") == namespace]

    def cached_get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any] | None:
        """One cached object (read-only), or None."""
        return self._cache[rt].get((namespace or "", name))

    def cached_owned(self, rt: ResourceType, owner_uid: str) -> list[dict[str, Any]]:
        """Cached objects of ``rt`` whose controlling owner has ``owner_uid`` (read-only)."""
        return list(self._owned[rt].get(owner_uid, {}).values())

    def enqueue(self, namespace: str | None, name: str) -> None:
        self._queue[(namespace or "", name)] = None

    def pending(self) -> bool:
        # Deferred timers are re-armed by the next run (they must not keep a loop-less settle spinning).
        return bool(self._queue)

    def run_once(self) -> bool:
        """Reconcile every queued key once; True if there was work."""
        if self._deferred:
            deferred, self._deferred = self._deferred, []
            for when, (ns, name) in deferred:
                self.requeue_at(when, ns, name)
        if not self._queue:
            return False
        keys = list(self._queue)
        self._queue.clear()
        for ns, name in keys:
            try:
                self.reconcile(ns, name)
            except ApiError as e:
                if e.code == 409:
                    self._queue[(ns, name)] = None  # stale read: try again
                elif e.message.startswith("admission webhook") or "failed calling webhook" in e.message:
                    # A webhook refused a write made from a stale view, or could not be called: retry
                    # shortly, as controller-runtime requeues with back-off.
                    log.debug("kubesim %s: %s/%s refused, retrying: %s", self.name, ns, name, e.message)
                    self.requeue_at(self.clock.now() + 1.0, ns, name)
                elif e.code != 404:
                    log.warning("kubesim %s: reconcile %s/%s: %s", self.name, ns, name, e.message)
                    self.errors.append(f"{ns}/{name}: {e.message}")
            except Exception as e:  # a bug must not take the whole simulator down
                log.exception("kubesim %s: reconcile %s/%s failed", self.name, ns, name)
                self.errors.append(f"{ns}/{name}: {type(e).__name__}: {e}")
        return True

    def requeue_at(self, when: float, namespace: str | None, name: str) -> None:
        """Reconcile ``(namespace, name)`` again once the clock reaches ``when`` (earliest request wins)."""
        key = (namespace or "", name)
        existing = self._timers.get(key)
        if existing is not None and existing[0] <= when and not existing[1].cancelled:
            return
        if existing is not None:
            existing[1].cancel()

        def fire() -> None:
            cur = self._timers.get(key)
            if cur is not None and cur[0] == when:
                del self._timers[key]
            self._queue[key] = None

        try:
            handle = self.clock.call_at(when, fire)
        except RuntimeError:
            # A real clock needs a running event loop; outside one (e.g. objects created before
            # Simulator.start()) keep the wish and arm it on the next run inside the loop.
            self._deferred.append((when, key))
            return
        self._timers[key] = (when, handle)

    # ---------------------------------------------------------------------------------- writes

    def write(self, rt: ResourceType, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
        """Write spec/metadata and status of ``after`` if they differ from ``before``."""
        out = before
        main_before = {k: v for k, v in before.items() if k != "status"}
        main_after = {k: v for k, v in after.items() if k != "status"}
        if main_before != main_after:
            body = copy.deepcopy(after)
            body["metadata"].pop("resourceVersion", None)
            out = self.store.replace(rt, body)
        if rt.has_status and before.get("status") != after.get("status"):
            body = copy.deepcopy(out)
            body["status"] = copy.deepcopy(after.get("status") or {})
            out = self.store.update_status(rt, body)
        return out

    def get_or_none(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any] | None:
        try:
            return self.store.get(rt, namespace, name)
        except ApiError as e:
            if e.code == 404:
                return None
            raise

    def record_event(
        self, obj: dict[str, Any], etype: str, reason: str, message: str, *, component: str | None = None
    ) -> None:
        """Record an Event about ``obj`` through the simulator's recorder (client-go's correlation:
        repeats bump ``count``, similar ones are combined, spam is dropped)."""
        self.sim.recorder.record(obj, etype, reason, message, component=component or self.name)


def owner_ref(obj: dict[str, Any], *, controller: bool = True, block: bool = True) -> dict[str, Any]:
    """An ownerReference to ``obj``."""
    meta = obj["metadata"]
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": controller,
        "blockOwnerDeletion": block,
    }


def controller_of(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The controlling ownerReference of ``obj``, if any."""
    for ref in (obj.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None
