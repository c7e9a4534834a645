"""kube-controller-manager's garbage collector and namespace deleter, after the API server answered.

A real API server only records a deletion's wishes: the propagation policy becomes a finalizer
(``orphan``, ``foregroundDeletion``: the generic registry's ``deletionFinalizersForGarbageCollection``) and a
namespace turns ``Terminating``. Collecting is kube-controller-manager's, asynchronously
(``pkg/controller/garbagecollector``: the graph builder watches every kind, ``attemptToDelete`` and
``attemptToOrphan`` act; ``pkg/controller/namespace/deletion``), so a bare API server collects nothing and a
client sees a cascade complete only by watching or polling. This controller does the same over the store's
public calls, driven by its events:

- a dependent whose owners are all gone (or being deleted in the foreground) is deleted — in the
  foreground when its owner waits in the foreground and it has dependents of its own, else in the
  background; one with a surviving owner only loses the references to the others
  (``attemptToDeleteItem``);
- an owner being deleted in the foreground keeps ``foregroundDeletion`` until no dependent with
  ``blockOwnerDeletion`` is left, then the finalizer is removed and the store removes the object
  (``processDeletingDependentsItem``);
- an object with the ``orphan`` finalizer has its dependents' references to it removed, then the
  finalizer (``attemptToOrphanWorker``, ``orphanDependents``);
- a terminating namespace has its content deleted (background) and is finalized once empty
  (``NamespacedResourcesDeleter``).

An owner kept by ``ObjectStore.add_foreground_hold`` (Trainer v2.3.0 re-applying its JobSet) keeps its
finalizer, and a new dependent of it is collected ``GC_LATENCY`` seconds after it appears.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kubesim.controllers.base import BaseController, log
from kubesim.errors import ApiError
from kubesim.resources import NAMESPACES, REGISTRY, ResourceType
from kubesim.store import FOREGROUND, ORPHAN_FINALIZER

if TYPE_CHECKING:
    from kubesim.store import WatchEvent

__all__ = ["GC_LATENCY", "GarbageCollectorController"]

GC_LATENCY = 1.0
"""Seconds the collector takes to collect a new dependent of a held owner (add_foreground_hold)."""

Loc = tuple[ResourceType, str, str]  # (type, namespace or "", name)
Work = tuple[
    str, Any
]  # ("owner", uid) | ("dependent", Loc) | ("ripe", Loc) | ("orphan", uid) | ("namespace", name)


def _ref_uids(obj: dict[str, Any] | None) -> set[str]:
    return {str(r.get("uid")) for r in ((obj or {}).get("metadata") or {}).get("ownerReferences") or []}


class GarbageCollectorController(BaseController):
    """Owner references, deletion propagation and namespace deletion, as kube-controller-manager."""

    name = "garbage-collector"

    def __init__(self) -> None:
        super().__init__()
        self._work: deque[Work] = deque()
        self._late: set[Loc] = set()

    # ---------------------------------------------------------------------------------- queue

    def resync(self) -> None:
        for rt in REGISTRY.values():
            for obj in self.store.list(rt)[0]:
                self._note(rt, obj, None, deleted=False)

    def _on_event(self, ev: WatchEvent) -> None:
        self._note(ev.rt, ev.obj, ev.old, deleted=ev.type == "DELETED")

    def _note(
        self, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None, *, deleted: bool
    ) -> None:
        """The graph builder's part: which owners, dependents and namespaces this change concerns."""
        meta = obj["metadata"]
        key: Loc = (rt, meta.get("namespace") or "" if rt.namespaced else "", meta["name"])
        refs = set() if deleted else _ref_uids(obj)
        for uid in _ref_uids(old) - refs:
            self._work.append(("owner", uid))  # an owner lost a dependent: it may be free to go
        if deleted:
            self._work.append(("owner", meta["uid"]))
            self._work.extend(("owner", uid) for uid in _ref_uids(obj))
            if rt.namespaced:
                self._work.append(("namespace", key[1]))
            return
        if refs and (old is None or _ref_uids(old) != refs):
            # A new dependent or new references; owners' own changes re-examine theirs ("owner").
            self._work.append(("dependent", key))
        if meta.get("deletionTimestamp"):
            finalizers = meta.get("finalizers") or []
            if FOREGROUND in finalizers:
                self._work.append(("owner", meta["uid"]))
            if ORPHAN_FINALIZER in finalizers:
                self._work.append(("orphan", meta["uid"]))
            if rt is NAMESPACES:
                self._work.append(("namespace", meta["name"]))

    def pending(self) -> bool:
        return bool(self._work)

    def run_once(self) -> bool:
        if not self._work:
            return False
        work, self._work = self._work, deque()
        seen: set[tuple[str, Any]] = set()
        for item in work:
            if item in seen:
                continue
            seen.add(item)
            try:
                self._handle(*item)
            except ApiError as e:
                if e.code == 409:
                    self._work.append(item)  # a stale read: try again
                elif e.code != 404:
                    # A webhook that cannot be called, a refused write: the collector retries later.
                    log.debug("kubesim %s: %s %s: %s", self.name, item[0], item[1], e.message)
                    self._retry_later(item)
            except Exception as e:  # a bug must not take the whole simulator down
                log.exception("kubesim %s: %s %s failed", self.name, item[0], item[1])
                self.errors.append(f"{item[0]} {item[1]}: {type(e).__name__}: {e}")
        return True

    def _retry_later(self, item: Work) -> None:
        try:
            self.clock.call_at(self.clock.now() + GC_LATENCY, lambda: self._work.append(item))
        except RuntimeError:
            self._work.append(item)  # no event loop: the next run tries again

    def _handle(self, kind: str, arg: Any) -> None:
        if kind == "owner":
            self._owner(arg)
        elif kind == "dependent":
            self._dependent(*arg)
        elif kind == "ripe":
            self._dependent(*arg, ripe=True)
        elif kind == "orphan":
            self._orphan(arg)
        elif kind == "namespace":
            self._namespace(arg)

    # ---------------------------------------------------------------------------------- reads

    def _locate(self, uid: str) -> tuple[ResourceType, dict[str, Any]] | None:
        return self.store.get_by_uid(uid)

    def _owner_state(self, uid: str) -> str:
        """ "absent", "foreground" (being deleted, waiting for dependents) or "solid"."""
        found = self._locate(uid)
        if found is None:
            return "absent"
        meta = found[1]["metadata"]
        if meta.get("deletionTimestamp") and FOREGROUND in (meta.get("finalizers") or []):
            return "foreground"
        return "solid"

    def _without_finalizer(self, rt: ResourceType, obj: dict[str, Any], finalizer: str) -> None:
        self._replace_without(rt, obj, "finalizers", lambda f: f == finalizer)

    def _replace_without(
        self, rt: ResourceType, obj: dict[str, Any], field: str, drop: Callable[[Any], bool]
    ) -> None:
        """Write ``obj`` back with the entries of ``metadata.<field>`` that ``drop`` picks removed (the
        field itself when none is left)."""
        new = copy.deepcopy(obj)
        kept = [x for x in new["metadata"].get(field) or [] if not drop(x)]
        if kept:
            new["metadata"][field] = kept
        else:
            new["metadata"].pop(field, None)
        new["metadata"].pop("resourceVersion", None)
        self.store.replace(rt, new)

    # ---------------------------------------------------------------------------------- actions

    def _owner(self, uid: str) -> None:
        """Re-examine the dependents of ``uid`` and, if it is deleting in foreground, whether it may go."""
        state = self._owner_state(uid)
        if state != "solid":
            for loc in self.store.dependents(uid):
                self._dependent(*loc)
        if state != "foreground":
            return
        found = self._locate(uid)
        if found is None:
            return
        rt, owner = found
        for dep_rt, ns, name in self.store.dependents(uid):
            dep = self.get_or_none(dep_rt, ns or None, name)
            for ref in (dep or {}).get("metadata", {}).get("ownerReferences") or []:
                if ref.get("uid") == uid and ref.get("blockOwnerDeletion"):
                    return  # still blocked: the dependent's removal re-examines the owner
        if not self.store.held(owner):
            self._without_finalizer(rt, owner, FOREGROUND)

    def _dependent(self, rt: ResourceType, ns: str, name: str, *, ripe: bool = False) -> None:
        dep = self.get_or_none(rt, ns or None, name)
        if dep is None:
            return
        refs = dep["metadata"].get("ownerReferences") or []
        if not refs:
            return
        solid: list[dict[str, Any]] = []
        dangling: list[dict[str, Any]] = []
        waiting: list[dict[str, Any]] = []
        for ref in refs:
            state = self._owner_state(str(ref.get("uid", "")))
            (solid if state == "solid" else dangling if state == "absent" else waiting).append(ref)
        if solid:
            if dangling or waiting:
                drop = {r.get("uid") for r in dangling + waiting}
                new = copy.deepcopy(dep)
                new["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") not in drop]
                new["metadata"].pop("resourceVersion", None)
                self.store.replace(rt, new)
            return
        if dep["metadata"].get("deletionTimestamp"):
            return  # already on its way out
        loc: Loc = (rt, ns, name)
        if loc in self._late and not ripe:
            return  # a held owner's new dependent: collected when its timer fires
        held = not ripe and waiting and not dangling and any(self._held(r) for r in waiting)
        if held and self._collect_later(loc):
            return
        self._late.discard(loc)
        # attemptToDeleteItem: foreground when an owner waits for its dependents and this one has its own;
        # otherwise a policy finalizer already on the object is honoured; else background.
        if waiting and self.store.dependents(dep["metadata"]["uid"]):
            policy = "Foreground"
        elif ORPHAN_FINALIZER in (dep["metadata"].get("finalizers") or []):
            policy = "Orphan"
        else:
            policy = "Background"
        self.store.delete(rt, ns or None, name, propagation=policy)

    def _held(self, ref: dict[str, Any]) -> bool:
        found = self._locate(str(ref.get("uid")))
        return found is not None and self.store.held(found[1])

    def _collect_later(self, loc: Loc) -> bool:
        """Collect a held owner's new dependent after the collector's reaction time; False without a loop."""
        try:
            self.clock.call_at(self.clock.now() + GC_LATENCY, lambda: self._work.append(("ripe", loc)))
        except RuntimeError:
            return False  # no event loop (a real clock outside serving): collect at once
        self._late.add(loc)
        return True

    def _orphan(self, uid: str) -> None:
        """``attemptToOrphan``: the dependents lose their reference to ``uid``, then it loses ``orphan``."""
        found = self._locate(uid)
        if found is None:
            return
        owner = found[1]
        if ORPHAN_FINALIZER not in (owner["metadata"].get("finalizers") or []):
            return
        for dep_rt, ns, name in self.store.dependents(uid):
            dep = self.get_or_none(dep_rt, ns or None, name)
            if dep is None:
                continue
            self._replace_without(dep_rt, dep, "ownerReferences", lambda r: r.get("uid") == uid)
        found = self._locate(uid)
        if found is not None:
            self._without_finalizer(found[0], found[1], ORPHAN_FINALIZER)

    def _namespace(self, name: str) -> None:
        """The namespace controller: delete what a terminating namespace holds; finalize it once empty."""
        nsobj = self.get_or_none(NAMESPACES, None, name)
        if nsobj is None or not nsobj["metadata"].get("deletionTimestamp"):
            return
        remaining = 0
        for rt in REGISTRY.values():
            if not rt.namespaced:
                continue
            for obj in self.store.list(rt, name)[0]:
                if not obj["metadata"].get("deletionTimestamp"):
                    self.store.delete(rt, name, obj["metadata"]["name"], propagation="Background")
                if self.store.exists(rt, name, obj["metadata"]["name"]):
                    remaining += 1
        if remaining == 0:
            self.store.finalize_namespace(name)
