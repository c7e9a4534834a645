"""The object store: kubesim's single source of truth (the etcd + generic registry part of a real control
plane; per-kind behaviour is in ``strategies``, the watch history in ``history``, and garbage collection
is a controller's, ``controllers.garbagecollector``).

Controllers call it directly and synchronously; the HTTP server calls it for API requests. It keeps
Kubernetes semantics that clients can observe: one global resourceVersion counter, uid/generation/
creationTimestamp, status separated from spec, no-op updates that do not bump the resourceVersion,
finalizers and deletionTimestamp, graceful pod deletion, propagation policies recorded as the
``orphan``/``foregroundDeletion`` finalizers, an index of owner references, namespace lifecycle,
admission hooks, and a bounded per-type watch history (a resume from before the retained window is
answered 410 Expired).

Objects are plain JSON-like dicts. Every read returns a deep copy; ``WatchEvent.obj`` is one shared
copy per change — treat it as read-only.
"""

from __future__ import annotations

import builtins
import logging
import random
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from kubesim.clock import Clock, stamp, unstamp
from kubesim.defaults import ephemeral_containers
from kubesim.errors import (
    ApiError,
    Cause,
    already_exists,
    bad_request,
    conflict,
    internal,
    invalid,
    not_found,
)
from kubesim.history import EventType, WatchEvent, WatchHistory
from kubesim.patch import (
    APPLY,
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    apply_merge,
    deep_copy,
    json_patch,
    merge_patch,
    strategic_merge_patch,
)
from kubesim.resources import NAMESPACES, PODS, ResourceType
from kubesim.selectors import parse_field_selector, parse_label_selector
from kubesim.shapes import shape_causes
from kubesim.strategies import strategy_for
from kubesim.validation import validate_metadata

__all__ = ["AdmissionHook", "ObjectStore", "WatchEvent", "check_propagation"]  # WatchEvent: kubesim.history

log = logging.getLogger(__name__)

AdmissionHook = Callable[[str, ResourceType, dict[str, Any], dict[str, Any] | None], dict[str, Any] | None]

FOREGROUND = "foregroundDeletion"
ORPHAN_FINALIZER = "orphan"
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")


def check_propagation(policy: str | None) -> None:
    """422 Invalid unless ``policy`` is None or one of the three propagation policies."""
    if policy is not None and policy not in ("Background", "Foreground", "Orphan"):
        detail = f'Unsupported value: "{policy}": supported values: "Foreground", "Background", "Orphan"'
        raise ApiError(
            422,
            "Invalid",
            f'DeleteOptions.meta.k8s.io "" is invalid: propagationPolicy: {detail}',
            details={
                "group": "meta.k8s.io",
                "kind": "DeleteOptions",
                "causes": [
                    {"reason": "FieldValueNotSupported", "message": detail, "field": "propagationPolicy"}
                ],
            },
        )


def _copy(obj: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = deep_copy(obj)
    return out


def _spec_part(rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    skip = (
        ("metadata", "status", "apiVersion", "kind") if rt.has_status else ("metadata", "apiVersion", "kind")
    )
    return {k: v for k, v in obj.items() if k not in skip}


def _without_rv(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj.get("metadata", {}).items() if k not in ("resourceVersion", "managedFields")}
    out = dict(obj)
    out["metadata"] = meta
    return out


class ObjectStore:
    """In-memory objects indexed by (type, namespace, name), with Kubernetes write semantics."""

    def __init__(self, clock: Clock, *, history_limit: int = 10_000) -> None:
        self.clock = clock
        self.history_limit = history_limit
        self._rv = 0
        # rt -> namespace ("" when cluster-scoped) -> name -> object
        self._objs: dict[ResourceType, dict[str, dict[str, dict[str, Any]]]] = {}
        self._by_uid: dict[str, tuple[ResourceType, str, str]] = {}
        self._dependents: dict[str, set[tuple[ResourceType, str, str]]] = {}
        self._history = WatchHistory(history_limit)
        self._subscribers: list[Callable[[WatchEvent], None]] = []
        self._rt_subscribers: dict[ResourceType, list[Callable[[WatchEvent], None]]] = {}
        self._mutating: dict[ResourceType, list[AdmissionHook]] = {}
        self._validating: dict[ResourceType, list[AdmissionHook]] = {}
        # server-side apply: the last configuration each field manager applied, per object
        self._applied: dict[tuple[ResourceType, str, str], dict[tuple[str, str], Any]] = {}
        self._holds: list[Callable[[dict[str, Any]], bool]] = []
        self._rng = random.Random(0x5EED)
        for ns in _SYSTEM_NAMESPACES:
            self.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    def __repr__(self) -> str:
        count = sum(len(names) for by_ns in self._objs.values() for names in by_ns.values())
        return f"ObjectStore(objects={count}, resourceVersion={self._rv})"

    # ------------------------------------------------------------------------------------ plumbing

    @property
    def resource_version(self) -> int:
        """The current value of the global resourceVersion counter."""
        return self._rv

    def add_admission(self, rt: ResourceType, hook: AdmissionHook, *, mutating: bool = False) -> None:
        """Register an admission hook for ``rt`` (mutating hooks run before validation, validating after).

        Hooks see CREATE, UPDATE (main resource, not the status subresource) and DELETE, from API requests
        and from controllers alike, including dry runs. Raise ``ApiError`` to refuse."""
        (self._mutating if mutating else self._validating).setdefault(rt, []).append(hook)

    def subscribe(
        self, fn: Callable[[WatchEvent], None], *, rt: ResourceType | None = None
    ) -> Callable[[], None]:
        """Call ``fn`` synchronously after each committed change (of ``rt`` only, if given).

        ``fn`` must not write to the store (enqueue work instead). Returns an unsubscribe function."""
        target = self._subscribers if rt is None else self._rt_subscribers.setdefault(rt, [])
        target.append(fn)

        def unsubscribe() -> None:
            try:
                target.remove(fn)
            except ValueError:
                pass

        return unsubscribe

    def add_foreground_hold(self, fn: Callable[[dict[str, Any]], bool]) -> None:
        """Model a controller that re-creates the dependents of an owner being deleted in the foreground
        faster than the garbage collector can remove the owner (Trainer v2.3.0 re-applying its JobSet):
        while ``fn(owner)`` is True, the garbage collector (``controllers.garbagecollector``) leaves the
        owner its ``foregroundDeletion`` finalizer although no blocking dependent is left, and collects a
        new dependent of it only after its reaction time, so its own dependents appear meanwhile. ``fn``
        must not write."""
        self._holds.append(fn)

    def held(self, owner: dict[str, Any]) -> bool:
        """Whether a registered foreground hold keeps ``owner`` (see ``add_foreground_hold``)."""
        return any(hold(owner) for hold in self._holds)

    @contextmanager
    def _operation(self) -> Iterator[None]:
        # One store call. Garbage collection is not the store's: kube-controller-manager's collector
        # (controllers.garbagecollector) reacts to the events afterwards, as on a cluster.
        yield

    def _bucket(self, rt: ResourceType, ns: str) -> dict[str, dict[str, Any]]:
        return self._objs.setdefault(rt, {}).setdefault(ns, {})

    def _ns_key(self, rt: ResourceType, namespace: str | None) -> str:
        if not rt.namespaced:
            return ""
        if not namespace:
            raise bad_request(f"a namespace is required for {rt.qualified}")
        return namespace

    def _lookup(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any] | None:
        by_ns = self._objs.get(rt)
        if by_ns is None:
            return None
        bucket = by_ns.get(self._ns_key(rt, namespace))
        return None if bucket is None else bucket.get(name)

    def _notify(self, ev: WatchEvent) -> None:
        self._history.record(ev)
        for fn in list(self._rt_subscribers.get(ev.rt, ())) + list(self._subscribers):
            try:
                fn(ev)
            except Exception:  # a broken subscriber must not corrupt a committed write
                log.exception("kubesim: watch subscriber %r failed on %r", fn, ev)

    def _commit(
        self, rt: ResourceType, etype: EventType, new: dict[str, Any], old: dict[str, Any] | None
    ) -> dict[str, Any]:
        """Store ``new`` (or remove it for DELETED) under a fresh resourceVersion and emit the event."""
        self._rv += 1
        meta = new["metadata"]
        meta["resourceVersion"] = str(self._rv)
        ns = meta.get("namespace", "") if rt.namespaced else ""
        name = meta["name"]
        uid = meta["uid"]
        bucket = self._bucket(rt, ns)
        if etype == "DELETED":
            bucket.pop(name, None)
            self._by_uid.pop(uid, None)
            self._applied.pop((rt, ns, name), None)
        else:
            bucket[name] = new
            self._by_uid[uid] = (rt, ns, name)
        self._index_owners(rt, ns, name, new if etype != "DELETED" else None, old)
        self._notify(WatchEvent(etype, rt, deep_copy(new), old))
        return new

    def _index_owners(
        self, rt: ResourceType, ns: str, name: str, new: dict[str, Any] | None, old: dict[str, Any] | None
    ) -> None:
        key = (rt, ns, name)
        old_uids = {r.get("uid") for r in (old or {}).get("metadata", {}).get("ownerReferences") or []}
        new_uids = {r.get("uid") for r in (new or {}).get("metadata", {}).get("ownerReferences") or []}
        for uid in old_uids - new_uids:
            deps = self._dependents.get(uid)
            if deps is not None:
                deps.discard(key)
                if not deps:
                    del self._dependents[uid]
        for uid in new_uids - old_uids:
            self._dependents.setdefault(uid, set()).add(key)

    # --------------------------------------------------------------------------------- admission

    def _admit(
        self, op: str, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None, *, validate: bool
    ) -> dict[str, Any]:
        for hook in self._mutating.get(rt, ()):
            out = self._call_hook(hook, op, rt, obj, old)
            if out is not None:
                obj = out
        if validate:
            causes = validate_metadata(obj.get("metadata", {}), name_rule=strategy_for(rt).name_rule)
            if causes:
                raise invalid(rt, str(obj.get("metadata", {}).get("name") or ""), causes)
        for hook in self._validating.get(rt, ()):
            self._call_hook(hook, op, rt, obj, old)
        return obj

    @staticmethod
    def _check_shape(rt: ResourceType, obj: dict[str, Any]) -> None:
        """Refuse wrongly typed fields that kubesim's own code reads (422), before anything walks them."""
        causes = shape_causes(rt, obj)
        if causes:
            raise invalid(rt, str(obj.get("metadata", {}).get("name") or ""), causes)

    @staticmethod
    def _call_hook(
        hook: AdmissionHook, op: str, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
    ) -> dict[str, Any] | None:
        try:
            return hook(op, rt, obj, old)
        except ApiError:
            raise
        except Exception as exc:  # a crashing webhook is an internal error, as with a real server
            log.exception("kubesim: admission hook %r failed", hook)
            raise internal(f"admission hook for {rt.qualified} failed: {type(exc).__name__}: {exc}") from exc

    # ------------------------------------------------------------------------------------- reads

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> dict[str, Any]:
        """A deep copy of the object; ApiError 404 if absent."""
        obj = self._lookup(rt, namespace, name)
        if obj is None:
            raise not_found(rt, name)
        return _copy(obj)

    def exists(self, rt: ResourceType, namespace: str | None, name: str) -> bool:
        return self._lookup(rt, namespace, name) is not None

    def get_by_uid(self, uid: str) -> tuple[ResourceType, dict[str, Any]] | None:
        """The type and a copy of the object with this uid, or None."""
        loc = self._by_uid.get(uid)
        if loc is None:
            return None
        rt, ns, name = loc
        obj = self._objs[rt][ns][name]
        return rt, deep_copy(obj)

    def list(
        self,
        rt: ResourceType,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        """Matching objects (deep copies, sorted by namespace then name) and the list resourceVersion."""
        lsel = parse_label_selector(label_selector)
        fsel = parse_field_selector(rt, field_selector)
        by_ns = self._objs.get(rt, {})
        if rt.namespaced and namespace:
            buckets = [(namespace, by_ns.get(namespace, {}))]
        else:
            buckets = sorted(by_ns.items())
        only = fsel.exact_name()
        items: list[dict[str, Any]] = []
        for _, bucket in buckets:
            if only is not None:
                cands = [bucket[only]] if only in bucket else []
            else:
                cands = [bucket[n] for n in sorted(bucket)]
            for obj in cands:
                if lsel.matches(obj["metadata"].get("labels")) and fsel.matches(obj):
                    items.append(deep_copy(obj))
        return items, str(self._rv)

    def count(self, rt: ResourceType) -> int:
        """Number of stored objects of ``rt``."""
        return sum(len(b) for b in self._objs.get(rt, {}).values())

    def dependents(self, owner_uid: str) -> builtins.list[tuple[ResourceType, str, str]]:
        """(type, namespace, name) of objects with an ownerReference to ``owner_uid``."""
        return sorted(self._dependents.get(owner_uid, ()), key=lambda k: (k[0].plural, k[1], k[2]))

    def events_since(
        self, rt: ResourceType, namespace: str | None, resource_version: str | int
    ) -> builtins.list[WatchEvent]:
        """Changes of ``rt`` (in ``namespace``, or all) after ``resource_version``, oldest first.

        Raises ApiError 410 Expired ("too old resource version: N (M)") when the retained history no
        longer reaches back to it, and 504-style Timeout when it is in the future."""
        return self._history.since(rt, namespace, resource_version, self._rv)

    def expire_before(self, resource_version: int) -> None:
        """Make every resourceVersion older than ``resource_version`` too old to watch from (410), as a
        watch cache that starts with a list at that version has no earlier events; history is kept."""
        self._history.expire_before(resource_version)

    def compact(self) -> None:
        """Drop all watch history (fault injection): resuming from any earlier resourceVersion gives 410."""
        self._history.compact(self._rv)

    # ------------------------------------------------------------------------------------ create

    def create(
        self, rt: ResourceType, obj: dict[str, Any], *, dry_run: bool = False, reset_status: bool = False
    ) -> dict[str, Any]:
        """Create an object (201 semantics). Sets uid, resourceVersion, generation=1, creationTimestamp;
        honours ``metadata.generateName``; 409 AlreadyExists; 404 for a missing namespace.

        ``reset_status=True`` (what the HTTP server passes) discards a client-supplied status the way the
        apiserver does for types with a status subresource (pods start ``Pending``)."""
        with self._operation():
            return self._create(rt, obj, dry_run=dry_run, reset_status=reset_status)

    def _create(
        self, rt: ResourceType, obj: dict[str, Any], *, dry_run: bool, reset_status: bool
    ) -> dict[str, Any]:
        if not isinstance(obj, dict):
            raise bad_request(f"the body of a {rt.kind} must be a JSON object")
        new = _copy(obj)
        meta = new.get("metadata")
        if meta is None:
            meta = new["metadata"] = {}
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        new["apiVersion"] = rt.api_version
        new["kind"] = rt.kind
        if rt.namespaced:
            ns = meta.get("namespace")
            if not ns or not isinstance(ns, str):
                raise invalid(rt, str(meta.get("name") or ""), [Cause.required("metadata.namespace")])
        else:
            meta.pop("namespace", None)
            ns = ""
        if meta.get("resourceVersion"):
            raise bad_request("resourceVersion should not be set on objects to be created")
        for k in ("uid", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"):
            meta.pop(k, None)
        generate = meta.get("generateName")
        if not meta.get("name") and generate and isinstance(generate, str):
            meta["name"] = self._generate_name(rt, ns, generate)
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = stamp(self.clock, self.clock.now())
        strategy = strategy_for(rt)
        if strategy.tracks_generation:
            meta["generation"] = 1
        if reset_status and rt.has_status and strategy.resets_status_on_create:
            new.pop("status", None)
        self._check_shape(rt, new)
        strategy.prepare_for_create(new, now=self.clock.wall(self.clock.now()), from_api=reset_status)
        if rt.namespaced:
            nsobj = self._lookup(NAMESPACES, None, ns)
            if nsobj is None:
                raise not_found(NAMESPACES, ns)
            if nsobj["metadata"].get("deletionTimestamp"):
                raise ApiError(
                    403,
                    "Forbidden",
                    f'{rt.qualified} "{meta.get("name", "")}" is forbidden: unable to create new content in '
                    f"namespace {ns} because it is being terminated",
                    details={
                        "name": meta.get("name", ""),
                        "group": rt.group,
                        "kind": rt.plural,
                        "causes": [
                            {
                                "reason": "NamespaceTerminating",
                                "message": f"namespace {ns} is being terminated",
                                "field": "metadata.namespace",
                            }
                        ],
                    },
                )
        new = self._admit("CREATE", rt, new, None, validate=True)
        meta = new["metadata"]
        name = meta["name"]
        if self._lookup(rt, ns, name) is not None:
            raise already_exists(rt, name)
        if dry_run:
            meta.pop("resourceVersion", None)
            return new
        self._commit(rt, "ADDED", new, None)
        return _copy(new)

    def _generate_name(self, rt: ResourceType, ns: str, prefix: str) -> str:
        for _ in range(100):
            suffix = "".join(self._rng.choice(_GENERATE_ALPHABET) for _ in range(5))
            name = prefix[: 63 - 5] + suffix if len(prefix) > 58 else prefix + suffix
            if self._lookup(rt, ns, name) is None:
                return name
        raise ApiError(500, "AlreadyExists", f"could not generate a unique name with prefix {prefix!r}")

    # ------------------------------------------------------------------------------------ update

    def replace(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        require_resource_version: bool = False,
    ) -> dict[str, Any]:
        """PUT: replace the object (or, with ``subresource="status"``, only its status).

        A ``metadata.resourceVersion`` in ``obj`` must equal the stored one (else 409 Conflict). The main
        resource ignores status changes when the type has a status subresource; ``generation`` is bumped
        when the spec changes; an update that changes nothing keeps the resourceVersion (no event)."""
        with self._operation():
            return self._replace(
                rt, obj, subresource=subresource, dry_run=dry_run, require_rv=require_resource_version
            )

    def _replace(
        self,
        rt: ResourceType,
        obj: dict[str, Any],
        *,
        subresource: str | None,
        dry_run: bool,
        require_rv: bool = False,
        check_rv: bool = True,
    ) -> dict[str, Any]:
        if not isinstance(obj, dict) or not isinstance(obj.get("metadata"), dict):
            raise bad_request(f"the body of a {rt.kind} must be a JSON object with metadata")
        if subresource not in (None, "status", "ephemeralcontainers", "binding"):
            raise bad_request(f"subresource {subresource!r} cannot be updated")
        if subresource == "status" and not rt.has_status:
            raise not_found(rt, str(obj["metadata"].get("name", "")))
        meta_in = obj["metadata"]
        name = meta_in.get("name")
        if not name:
            raise invalid(rt, "", [Cause.required("metadata.name", "name is required")])
        ns = self._ns_key(rt, meta_in.get("namespace"))
        current = self._lookup(rt, ns, name)
        if current is None:
            raise not_found(rt, name)
        cur_meta = current["metadata"]
        rv_in = meta_in.get("resourceVersion")
        if check_rv and rv_in:
            if str(rv_in) != cur_meta["resourceVersion"]:
                raise conflict(rt, name)
        elif require_rv and not rv_in:
            # The registry names the resource (not the kind) here and prints the zero as Go's %#v does.
            cause = Cause("metadata.resourceVersion", "Invalid value: 0x0: must be specified for an update")
            raise ApiError(
                422,
                "Invalid",
                f'{rt.qualified} "{name}" is invalid: {cause}',
                details={
                    "name": name,
                    **({"group": rt.group} if rt.group else {}),
                    "kind": rt.plural,
                    "causes": [cause.as_dict()],
                },
            )
        uid_in = meta_in.get("uid")
        if uid_in and uid_in != cur_meta["uid"]:
            raise conflict(
                rt,
                name,
                f"Precondition failed: UID in precondition: {uid_in}, UID in object meta: {cur_meta['uid']}",
            )
        if subresource == "status":
            new = _copy(current)
            if "status" in obj:
                new["status"] = deep_copy(obj["status"])
            else:
                new.pop("status", None)
        elif subresource == "binding":
            # pods/binding: the node and the PodScheduled condition in one update, as the binding
            # registry's setPodNodeAndMetadata writes them (no generation bump: it bypasses the strategy)
            new = _copy(current)
            new.setdefault("spec", {})["nodeName"] = (obj.get("spec") or {}).get("nodeName")
            new["status"] = deep_copy(obj.get("status") or {})
        elif subresource == "ephemeralcontainers":
            new = _copy(current)
            new.setdefault("spec", {})["ephemeralContainers"] = ephemeral_containers(
                name, (current.get("spec") or {}).get("ephemeralContainers"), obj.get("spec")
            )
        else:
            new = _copy(obj)
            new["apiVersion"] = rt.api_version
            new["kind"] = rt.kind
            meta = new["metadata"]
            for k in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "namespace",
            ):
                if k in cur_meta:
                    meta[k] = cur_meta[k]
                else:
                    meta.pop(k, None)
            meta.pop("managedFields", None)
            if "generateName" in cur_meta:
                meta["generateName"] = cur_meta["generateName"]
            else:
                meta.pop("generateName", None)
            if rt.has_status:
                if "status" in current:
                    new["status"] = deep_copy(current["status"])
                else:
                    new.pop("status", None)
            strategy_for(rt).prepare_for_update(new, current)
            if cur_meta.get("deletionTimestamp"):
                added = set(meta.get("finalizers") or []) - set(cur_meta.get("finalizers") or [])
                if added:
                    raise invalid(
                        rt,
                        name,
                        [
                            Cause.forbidden(
                                "metadata.finalizers",
                                "no new finalizers can be added if the object is being deleted, found new finalizers "
                                + "[]string{"
                                + ", ".join(f'"{f}"' for f in sorted(added))
                                + "}",
                            )
                        ],
                    )
            if _spec_part(rt, new) != _spec_part(rt, current) and "generation" in cur_meta:
                meta["generation"] = int(cur_meta["generation"]) + 1
            self._check_shape(rt, new)
            new = self._admit("UPDATE", rt, new, deep_copy(current), validate=True)
        new["metadata"]["resourceVersion"] = cur_meta["resourceVersion"]
        if _without_rv(new) == _without_rv(current):
            return _copy(current)  # a no-op update: no new resourceVersion, no event
        if dry_run:
            return new
        self._commit(rt, "MODIFIED", new, current)
        self._maybe_finish_deletion(rt, new)
        return _copy(self._lookup(rt, ns, name) or new)

    def bind(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """Bind a pod: ``obj``'s ``spec.nodeName`` and ``status`` (its PodScheduled condition) written in one
        update, one watch event (pkg/registry/core/pod/storage ``BindingREST.setPodNodeAndMetadata``)."""
        with self._operation():
            return self._replace(rt, obj, subresource="binding", dry_run=False, check_rv=False)

    def update_status(self, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
        """Replace the status subresource without a resourceVersion check (controller convenience)."""
        with self._operation():
            return self._replace(rt, obj, subresource="status", dry_run=False, check_rv=False)

    def mutate(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        fn: Callable[[dict[str, Any]], None],
        *,
        status: bool = False,
    ) -> dict[str, Any]:
        """Read-modify-write without a conflict check: ``fn`` edits a copy in place; ``status=True``
        writes through the status subresource (when the type has one)."""
        with self._operation():
            obj = self.get(rt, namespace, name)
            fn(obj)
            obj["metadata"].pop("resourceVersion", None)
            sub = "status" if status and rt.has_status else None
            return self._replace(rt, obj, subresource=sub, dry_run=False, check_rv=False)

    # ------------------------------------------------------------------------------------- patch

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Any,
        patch_type: str,
        *,
        subresource: str | None = None,
        dry_run: bool = False,
        field_manager: str | None = None,
        force: bool = False,
        prune: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        """PATCH with ``patch_type`` one of the merge, JSON, strategic-merge or apply content types.

        ``prune`` (what the HTTP server passes) sees the patched object (for apply: the applied
        configuration) before admission, to drop the fields the kind does not know.

        A resourceVersion placed in the patch acts as a precondition (409 when stale). Strategic merge
        patch is refused with 415 for custom resources, as a real server does. Apply creates the object
        when absent and, for one field manager, removes fields it applied before and omits now."""
        with self._operation():
            ns = self._ns_key(rt, namespace)
            if patch_type == STRATEGIC_MERGE_PATCH and not strategy_for(rt).strategic_merge:
                raise ApiError(
                    415,
                    "UnsupportedMediaType",
                    f"the body of the request was in an unknown format - accepted media types include: "
                    f"{JSON_PATCH}, {MERGE_PATCH}, {APPLY}",
                )
            current = self._lookup(rt, ns, name)
            if patch_type == APPLY:
                return self._apply(rt, ns, name, body, current, subresource, dry_run, field_manager, prune)
            if current is None:
                raise not_found(rt, name)
            if patch_type == MERGE_PATCH:
                if not isinstance(body, dict):
                    raise bad_request("a merge patch must be a JSON object")
                patched = merge_patch(current, body)
            elif patch_type == JSON_PATCH:
                patched = json_patch(current, body)
            elif patch_type == STRATEGIC_MERGE_PATCH:
                if not isinstance(body, dict):
                    raise bad_request("a strategic merge patch must be a JSON object")
                patched = strategic_merge_patch(current, body)
            else:
                raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {patch_type!r}")
            if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
                raise ApiError(422, "Invalid", "the patched object must be a JSON object with metadata")
            patched["metadata"]["name"] = name
            if rt.namespaced:
                patched["metadata"]["namespace"] = ns
            if prune is not None:
                prune(patched)
            return self._replace(rt, patched, subresource=subresource, dry_run=dry_run)

    def _apply(
        self,
        rt: ResourceType,
        ns: str,
        name: str,
        body: Any,
        current: dict[str, Any] | None,
        subresource: str | None,
        dry_run: bool,
        field_manager: str | None,
        prune: Callable[[dict[str, Any]], None] | None = None,
    ) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise bad_request("an apply patch must be a YAML or JSON object")
        if not field_manager:
            raise ApiError(
                422,
                "Invalid",
                'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch',
                details={
                    "group": "meta.k8s.io",
                    "kind": "PatchOptions",
                    "causes": [
                        {
                            "reason": "FieldValueRequired",
                            "message": "Required value: is required for apply patch",
                            "field": "fieldManager",
                        }
                    ],
                },
            )
        meta = body.get("metadata") or {}
        if body.get("apiVersion") != rt.api_version or body.get("kind") != rt.kind:
            raise bad_request(
                f"apply patch apiVersion/kind {body.get('apiVersion')}/{body.get('kind')} does not match "
                f"{rt.api_version}/{rt.kind}"
            )
        if meta.get("name") not in (None, name):
            raise bad_request(
                f"the name of the object ({meta.get('name')}) does not match the name on the URL ({name})"
            )
        applied = deep_copy(body)
        if prune is not None:
            prune(applied)
        applied.setdefault("metadata", {})["name"] = name
        if rt.namespaced:
            applied["metadata"]["namespace"] = ns
        key = (rt, ns, name)
        if current is None:
            if subresource:
                raise not_found(rt, name)
            out = self._create(rt, applied, dry_run=dry_run, reset_status=False)
            if not dry_run:
                self._applied[key] = {(field_manager, ""): applied}
            return out
        previous = self._applied.get(key, {}).get((field_manager, subresource or ""))
        base = _copy(current)
        merged = apply_merge(base, applied, previous)
        merged["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        if meta.get("resourceVersion"):
            merged["metadata"]["resourceVersion"] = meta["resourceVersion"]
        out = self._replace(rt, merged, subresource=subresource, dry_run=dry_run)
        if not dry_run:
            self._applied.setdefault(key, {})[(field_manager, subresource or "")] = applied
        return out

    # ------------------------------------------------------------------------------------ delete

    def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        *,
        propagation: str | None = None,
        grace_period_seconds: int | None = None,
        dry_run: bool = False,
        preconditions: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """DELETE. Returns the object: its final state when removed now, or with ``deletionTimestamp`` when
        finalizers (or a pod's grace period) keep it for a while.

        ``propagation``: "Background" (default; "Orphan" for batch/v1 Jobs, as the real API),
        "Foreground" (the owner waits, with the ``foregroundDeletion`` finalizer, until its blocking
        dependents are gone) or "Orphan" (dependents lose their ownerReference). Pods bound to a node and
        not finished are deleted gracefully: they stay, terminating, until the kubelet calls
        ``finalize_pod_deletion`` (or a delete with grace 0 forces them)."""
        with self._operation():
            return self._delete(
                rt,
                namespace,
                name,
                propagation=propagation,
                grace=grace_period_seconds,
                dry_run=dry_run,
                preconditions=preconditions,
            )

    def _delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        *,
        propagation: str | None,
        grace: int | None,
        dry_run: bool,
        preconditions: dict[str, Any] | None,
    ) -> dict[str, Any]:
        ns = self._ns_key(rt, namespace)
        current = self._lookup(rt, ns, name)
        if current is None:
            raise not_found(rt, name)
        cur_meta = current["metadata"]
        if preconditions:
            p_uid = preconditions.get("uid")
            if p_uid and p_uid != cur_meta["uid"]:
                raise conflict(
                    rt,
                    name,
                    f"Precondition failed: UID in precondition: {p_uid}, UID in object meta: {cur_meta['uid']}",
                )
            p_rv = preconditions.get("resourceVersion")
            if p_rv and str(p_rv) != cur_meta["resourceVersion"]:
                raise conflict(
                    rt,
                    name,
                    f"Precondition failed: ResourceVersion in precondition: {p_rv}, "
                    f"ResourceVersion in object meta: {cur_meta['resourceVersion']}",
                )
        strategy = strategy_for(rt)
        explicit = propagation is not None
        if propagation is None:
            propagation = strategy.default_propagation
        check_propagation(propagation)
        for hook in self._validating.get(rt, ()):
            self._call_hook(hook, "DELETE", rt, deep_copy(current), deep_copy(current))
        now = self.clock.now()
        grace = strategy.delete_grace(current, grace)

        new = _copy(current)
        meta = new["metadata"]
        # As the generic registry's deletionFinalizersForGarbageCollection: the policy becomes a finalizer
        # the garbage collector acts on (orphan: strip the dependents' references; foregroundDeletion:
        # delete the blocking dependents first), replacing one a previous delete set.
        # Without an explicit policy, a policy finalizer the object already carries stands.
        finalizers: list[str] = list(meta.get("finalizers") or [])
        if explicit or not {FOREGROUND, ORPHAN_FINALIZER} & set(finalizers):
            finalizers = [f for f in finalizers if f not in (FOREGROUND, ORPHAN_FINALIZER)]
            if propagation == "Orphan":
                finalizers.append(ORPHAN_FINALIZER)
            elif propagation == "Foreground":
                finalizers.append(FOREGROUND)
        if finalizers:
            meta["finalizers"] = finalizers
        else:
            meta.pop("finalizers", None)
        if dry_run:
            meta.setdefault("deletionTimestamp", stamp(self.clock, now + grace))
            meta.setdefault("deletionGracePeriodSeconds", grace)
            return new

        already = bool(cur_meta.get("deletionTimestamp"))
        if already:
            if strategy.graceful:  # a second delete may shorten the grace period, never lengthen it
                remaining = int(cur_meta.get("deletionGracePeriodSeconds", 0))
                started = unstamp(self.clock, cur_meta["deletionTimestamp"]) - remaining
                if grace < remaining and now + grace < unstamp(self.clock, cur_meta["deletionTimestamp"]):
                    meta["deletionGracePeriodSeconds"] = grace
                    meta["deletionTimestamp"] = stamp(self.clock, max(started, now) + grace if grace else now)
            if new != current:
                self._commit(rt, "MODIFIED", new, current)
                self._maybe_finish_deletion(rt, new)
                return _copy(self._lookup(rt, ns, name) or new)
            return _copy(current)

        if not finalizers and grace == 0 and not strategy.always_graceful:
            self._commit(rt, "DELETED", new, current)
            return new
        meta["deletionTimestamp"] = stamp(self.clock, now + grace)
        meta["deletionGracePeriodSeconds"] = grace
        if "generation" in meta:
            meta["generation"] = int(meta["generation"]) + 1
        strategy.on_deletion_start(new)
        self._commit(rt, "MODIFIED", new, current)
        return _copy(new)

    def finalize_pod_deletion(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The kubelet has stopped a terminating pod: its grace period is over. The pod is removed (or
        waits for its remaining finalizers). Returns its last state, or None if it no longer exists."""
        with self._operation():
            current = self._lookup(PODS, namespace, name)
            if current is None:
                return None
            if not current["metadata"].get("deletionTimestamp"):
                raise bad_request(f'pod "{name}" in namespace "{namespace}" is not being deleted')
            new = _copy(current)
            new["metadata"]["deletionGracePeriodSeconds"] = 0
            if not new["metadata"].get("finalizers"):
                self._commit(PODS, "DELETED", new, current)
                return new
            self._commit(PODS, "MODIFIED", new, current)
            return _copy(new)

    def force_delete(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Delete a pod with grace period 0 (``kubectl delete --force``). None if it does not exist."""
        if not self.exists(PODS, namespace, name):
            return None
        return self.delete(PODS, namespace, name, grace_period_seconds=0)

    def _maybe_finish_deletion(self, rt: ResourceType, obj: dict[str, Any]) -> bool:
        """Remove an object whose deletion was waiting and has nothing left to wait for."""
        meta = obj["metadata"]
        if not meta.get("deletionTimestamp") or meta.get("finalizers"):
            return False
        if strategy_for(rt).deletion_pending(obj):
            return False
        ns = meta.get("namespace", "") if rt.namespaced else ""
        current = self._lookup(rt, ns, meta["name"])
        if current is None:
            return False
        self._commit(rt, "DELETED", deep_copy(current), current)
        return True

    # ------------------------------------------------------------------------------ namespaces

    def finalize_namespace(self, name: str) -> dict[str, Any] | None:
        """The namespace controller's ``finalize``: a terminating namespace's content is gone, so its
        ``spec.finalizers`` are cleared and it is removed. Returns its last state, or None if absent;
        400 if it is not being deleted."""
        with self._operation():
            current = self._lookup(NAMESPACES, None, name)
            if current is None:
                return None
            if not current["metadata"].get("deletionTimestamp"):
                raise bad_request(f'namespace "{name}" is not being deleted')
            new = _copy(current)
            new["spec"] = {}
            self._commit(NAMESPACES, "MODIFIED", new, current)
            self._maybe_finish_deletion(NAMESPACES, new)
            return _copy(self._lookup(NAMESPACES, None, name) or new)
