"""``dispatch-admission``: the Kueue admission check controller behind holds under Kueue (SPEC §9.8).

It serves the AdmissionCheck ``controllerName`` :data:`~dispatch_kubeflow.names.ADMISSION_CONTROLLER`:

- every AdmissionCheck naming that controller is marked ``Active`` (a ClusterQueue that lists an
  inactive check admits nothing, so Kueue waits for us);
- for every Workload whose ``status.admissionChecks`` lists one of those checks, the check's state
  follows the owning TrainJob's hold annotation (:func:`dispatch_kubeflow.holds.desired_check`):
  ``Pending`` while held, ``Retry`` to evict an admitted held job, ``Ready`` otherwise. It is written
  through the Workload's status subresource with server-side apply (field manager
  ``dispatch-admission``), touching only our checks' entries, as Kueue's own check controllers do.

It watches — never polls — AdmissionChecks, Workloads and TrainJobs (list, then watch from the list's
resourceVersion; a ``410 Gone`` relists), and acts only while it holds a ``coordination.k8s.io`` Lease
(client-go's leader election: renew every ``retry_period``, give up acting when a renewal has not
succeeded for ``renew_deadline``, take over a lease whose record has not changed for
``lease_duration``). :meth:`AdmissionController.stop` (SIGTERM in the console script) stops acting,
then releases the lease so a standby takes over at once.

Structured for metrics and logging to be added: the informers, the elector and the reconciler are
separate objects with counters (:attr:`AdmissionController.stats`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from dispatch import logs, metrics
from dispatch.clock import Clock, SystemClock
from dispatch.errors import (
    ConflictError,
    DispatchError,
    InvalidError,
    NotFoundError,
    OutcomeUnknownError,
    UnavailableError,
)
from dispatch_kubeflow.errors import ExpiredError, map_status
from dispatch_kubeflow.holds import desired_check
from dispatch_kubeflow.kube import KubeClient
from dispatch_kubeflow.names import ADMISSION_CONTROLLER, KUEUE_GROUP, KUEUE_VERSION, TRAINER_GROUP
from dispatch_kubeflow.objects import meta_of
from dispatch_kubeflow.resources import ADMISSION_CHECKS, LEASES, TRAINJOBS, WORKLOADS

__all__ = ["FIELD_MANAGER", "AdmissionController", "Informer", "LeaderElector", "LeaseSettings", "main"]

_log = logging.getLogger(__name__)

FIELD_MANAGER = "dispatch-admission"
"""The server-side apply field manager of every status the controller writes."""

Key = tuple[str, str]
"""(namespace, name); namespace ``""`` for a cluster-scoped object."""


def _micro_time(seconds: float) -> str:
    """A Kubernetes MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _key(obj: Mapping[str, Any]) -> Key:
    meta = meta_of(obj)
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _default_identity() -> str:
    return f"{socket.gethostname()}_{secrets.token_hex(4)}"


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """The leader-election Lease ``namespace/name`` and client-go's timings (seconds):
    ``duration`` > ``renew_deadline`` > ``retry_period`` > 0."""

    namespace: str = "dispatch-system"
    name: str = "dispatch-admission"
    identity: str = field(default_factory=_default_identity)
    duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.identity:
            raise InvalidError("the leader identity must not be empty", path="identity")
        if not 0 < self.retry_period < self.renew_deadline < self.duration:
            raise InvalidError(
                f"need 0 < retry period ({self.retry_period:g}) < renew deadline ({self.renew_deadline:g}) "
                f"< lease duration ({self.duration:g})",
                path="lease",
            )
        if self.duration < 1:
            raise InvalidError("the lease duration is whole seconds, at least 1", path="lease.duration")


class LeaderElector:
    """One attempt at a time to acquire or renew the Lease (client-go's ``tryAcquireOrRenew``).

    A lease held by another identity is taken over only when its record (holder, renew time) has not
    changed for its ``leaseDurationSeconds`` as measured on *this* process's clock since it was first
    seen — never by comparing the other process's timestamps with ours (clocks drift)."""

    def __init__(self, client: KubeClient, settings: LeaseSettings, clock: Clock) -> None:
        self._client = client
        self.settings = settings
        self._clock = clock
        self._observed: tuple[str, str] | None = None
        self._observed_at = 0.0
        self.path = LEASES.path(settings.namespace, settings.name)
        self.transitions = 0
        self.holder = ""
        """The holder seen by the last attempt."""

    def _spec(self, now: float, acquired: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.settings.identity,
            "leaseDurationSeconds": max(1, round(self.settings.duration)),
            "acquireTime": acquired,
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }

    async def try_acquire_or_renew(self) -> bool:
        """True when this identity holds the lease after the attempt."""
        now = self._clock.now()
        what = f"lease {self.settings.namespace}/{self.settings.name}"
        lease = await self._client.get_or_none(self.path, what=f"get {what}")
        if lease is None:
            spec = self._spec(now, _micro_time(now), 0)
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.settings.name, "namespace": self.settings.namespace},
                "spec": spec,
            }
            try:
                await self._client.create(LEASES.path(self.settings.namespace), body, what=f"create {what}")
            except ConflictError:
                return False  # another replica created it first (AlreadyExists)
            self._observed, self._observed_at = (self.settings.identity, spec["renewTime"]), now
            self.holder = self.settings.identity
            self.transitions += 1
            return True
        live = lease.get("spec")
        current: Mapping[str, Any] = live if isinstance(live, Mapping) else {}
        holder = str(current.get("holderIdentity") or "")
        record = (holder, str(current.get("renewTime") or ""))
        self.holder = holder
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = current.get("leaseDurationSeconds")
        duration = duration if isinstance(duration, int) and duration > 0 else self.settings.duration
        mine = holder == self.settings.identity
        if holder and not mine and self._observed_at + duration > now:
            return False
        transitions = current.get("leaseTransitions")
        transitions = transitions if isinstance(transitions, int) else 0
        acquired = str(current.get("acquireTime") or "") if mine else _micro_time(now)
        new = dict(lease)
        new["spec"] = self._spec(now, acquired, transitions if mine else transitions + 1)
        try:
            await self._client.replace(self.path, new, what=f"renew {what}")
        except ConflictError:
            return False  # someone else wrote it since we read it (the resourceVersion precondition)
        if not mine:
            self.transitions += 1
            _log.info("acquired %s as %s", what, self.settings.identity)
        self._observed, self._observed_at = (self.settings.identity, new["spec"]["renewTime"]), now
        self.holder = self.settings.identity
        return True

    async def release(self) -> None:
        """Give the lease up (holder emptied) if this identity still holds it, so a standby takes over
        without waiting for it to expire."""
        lease = await self._client.get_or_none(self.path, what="get the lease to release it")
        spec = lease.get("spec") if lease is not None else None
        if (
            lease is None
            or not isinstance(spec, dict)
            or spec.get("holderIdentity") != self.settings.identity
        ):
            return
        now = self._clock.now()
        new = dict(lease)
        new["spec"] = {
            **spec,
            "holderIdentity": "",
            "leaseDurationSeconds": 1,
            "renewTime": _micro_time(now),
        }
        # Changed hands meanwhile (409), or deleted (404): nothing to release.
        with contextlib.suppress(ConflictError, NotFoundError):
            await self._client.replace(self.path, new, what="release the lease")
            _log.info("released lease %s/%s", self.settings.namespace, self.settings.name)


class Informer:
    """A cache of one collection kept by list+watch. ``on_change(key, obj)`` is called for every
    change (``obj`` is ``None`` when the object went away). A ``410 Gone`` relists; a stream the server
    ends is resumed from the last resourceVersion seen (bookmarks included)."""

    def __init__(
        self,
        client: KubeClient,
        path: str,
        what: str,
        on_change: Callable[[Key, dict[str, Any] | None], None],
        *,
        clock: Clock,
        server_timeout: int = 300,
    ) -> None:
        self._client = client
        self.path = path
        self.what = what
        self._on_change = on_change
        self._clock = clock
        self._server_timeout = server_timeout
        self.cache: dict[Key, dict[str, Any]] = {}
        self.resource_version = ""
        self.synced = asyncio.Event()
        self.lists = 0
        self.watches = 0
        self.events = 0

    async def _relist(self) -> None:
        items, rv = await self._client.list_at(self.path, what=f"list {self.what}")
        self.lists += 1
        fresh = {_key(o): o for o in items}
        old, self.cache = self.cache, fresh
        for key in old.keys() - fresh.keys():
            self._on_change(key, None)
        for key, obj in fresh.items():
            before = old.get(key)
            if before is None or meta_of(before).get("resourceVersion") != meta_of(obj).get(
                "resourceVersion"
            ):
                self._on_change(key, obj)
        self.resource_version = rv
        self.synced.set()

    async def _events(self) -> AsyncIterator[dict[str, Any]]:
        """The events of one watch from :attr:`resource_version` (with bookmarks), until the server ends
        the stream. An ``ERROR`` event raises its status as a dispatch error (``ExpiredError`` for 410)."""
        what = f"watch {self.what}"
        params = {
            "watch": "true",
            "allowWatchBookmarks": "true",
            "resourceVersion": self.resource_version,
            "timeoutSeconds": str(self._server_timeout),
        }
        async for line in self._client.stream(
            self.path, what=what, params=params, read_timeout=self._server_timeout + 30.0
        ):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except ValueError:
                raise _Corrupt(f"{what}: the stream sent something that is not JSON") from None
            if not isinstance(event, dict):
                continue
            if event.get("type") == "ERROR":
                obj = event.get("object")
                status = obj if isinstance(obj, dict) else {}
                code = status.get("code")
                raise map_status(code if isinstance(code, int) else 500, status, what=what)
            yield event

    async def run(self) -> None:
        delay = 0.2
        need_list = True
        while True:
            try:
                if need_list:
                    await self._relist()
                    need_list = False
                self.watches += 1
                async for event in self._events():
                    self._apply(event)
                delay = 0.2  # the server ended the stream: watch again from the last version seen
            except (ExpiredError, _Corrupt) as exc:
                # The version is too old (410), or the stream's position cannot be trusted: list again.
                _log.info("%s: %s; listing again", self.what, exc)
                need_list = True
            except (UnavailableError, OutcomeUnknownError) as exc:
                # 429/5xx after the retries, or the connection broke: resume from the last version seen.
                _log.warning("%s: %s; retrying in %.1fs", self.what, exc, delay)
                await self._clock.sleep(delay)
                delay = min(delay * 2, 10.0)
            except DispatchError as exc:
                # Any other refusal (403 while RBAC is being fixed, ...): back off, then list afresh.
                _log.warning("%s: %s; retrying in %.1fs", self.what, exc, delay)
                await self._clock.sleep(delay)
                delay = min(delay * 2, 10.0)
                need_list = True

    def _apply(self, event: Mapping[str, Any]) -> None:
        obj = event.get("object")
        if not isinstance(obj, dict):
            return
        rv = meta_of(obj).get("resourceVersion")
        kind = event.get("type")
        if kind != "BOOKMARK":
            self.events += 1
            key = _key(obj)
            if kind == "DELETED":
                self.cache.pop(key, None)
                self._on_change(key, None)
            else:
                self.cache[key] = obj
                self._on_change(key, obj)
        if isinstance(rv, str) and rv:
            self.resource_version = rv


class _Corrupt(UnavailableError):
    """A watch stream that sent something other than JSON events: its position cannot be trusted."""


class _Reconciler:
    """The work the leader does: informers plus one reconcile loop over a set of dirty Workloads."""

    def __init__(self, client: KubeClient, clock: Clock, server_timeout: int) -> None:
        self._client = client
        self._clock = clock
        self._queue: set[Key] = set()
        self._checks_dirty = True
        self._wake = asyncio.Event()
        # Which Workloads a TrainJob owns (an index kept from Workload events), so a TrainJob's change
        # touches its own Workloads only.
        self._owned: dict[Key, set[Key]] = {}
        self._owner_of: dict[Key, Key] = {}
        self.busy = False
        self.writes = 0
        self.errors = 0
        self.conflicts = 0
        self.checks = Informer(
            client,
            ADMISSION_CHECKS.path(),
            "AdmissionChecks",
            self._on_check,
            clock=clock,
            server_timeout=server_timeout,
        )
        self.workloads = Informer(
            client,
            WORKLOADS.path(),  # every namespace
            "Workloads",
            self._on_workload,
            clock=clock,
            server_timeout=server_timeout,
        )
        self.trainjobs = Informer(
            client,
            TRAINJOBS.path(),  # every namespace
            "TrainJobs",
            self._on_trainjob,
            clock=clock,
            server_timeout=server_timeout,
        )

    @property
    def informers(self) -> tuple[Informer, ...]:
        return (self.checks, self.workloads, self.trainjobs)

    def pending(self) -> bool:
        return self.busy or bool(self._queue) or self._checks_dirty or self._wake.is_set()

    # --- event handlers (synchronous: they only mark work) ---------------------------------------------

    def _on_check(self, key: Key, obj: dict[str, Any] | None) -> None:
        self._checks_dirty = True
        self._wake.set()

    def _on_workload(self, key: Key, obj: dict[str, Any] | None) -> None:
        old = self._owner_of.pop(key, None)
        if old is not None:
            self._owned[old].discard(key)
            if not self._owned[old]:
                del self._owned[old]
        if obj is None:
            return
        owner = _owner(obj)
        if owner is not None:
            self._owner_of[key] = (key[0], owner[0])
            self._owned.setdefault((key[0], owner[0]), set()).add(key)
        self._queue.add(key)
        self._wake.set()

    def _on_trainjob(self, key: Key, obj: dict[str, Any] | None) -> None:
        owned = self._owned.get(key)
        if owned:
            self._queue.update(owned)
            self._wake.set()

    # --- the loop --------------------------------------------------------------------------------------

    def ours(self) -> set[str]:
        """Names of the AdmissionChecks served by our controller."""
        return {
            name
            for (_, name), ac in self.checks.cache.items()
            if (ac.get("spec") or {}).get("controllerName") == ADMISSION_CONTROLLER
        }

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            for informer in self.informers:
                tg.create_task(informer.run())
            tg.create_task(self._loop())

    async def _loop(self) -> None:
        for informer in self.informers:
            await informer.synced.wait()
        while True:
            await self._wake.wait()
            self._wake.clear()
            self.busy = True
            try:
                if self._checks_dirty:
                    self._checks_dirty = False
                    await self._activate()
                    self._queue.update(self.workloads.cache)
                keys, self._queue = self._queue, set()
                for key in sorted(keys):
                    try:
                        await self._reconcile(key)
                    except (KeyError, TypeError, ValueError, AttributeError) as exc:
                        # One malformed Workload must not stop the controller for every other one.
                        self.errors += 1
                        _log.error("Workload %s/%s skipped: %s: %s", *key, type(exc).__name__, exc)
            finally:
                self.busy = False

    async def _write(self, path: str, body: Mapping[str, Any], what: str, retry: Callable[[], None]) -> None:
        """Apply ``body`` to a status; on failure, log and schedule ``retry`` (a 404: gone, nothing to do)."""
        try:
            await _apply(self._client, path, body, what=what)
            self.writes += 1
            for state in _check_states(body):
                metrics.current().inc("dispatch_admission_checks_total", {"state": state})
        except (NotFoundError, ConflictError):
            # Gone, or changed since the cached version we decided on (the precondition): the watch
            # brings the newer version, and with it a fresh decision.
            self.conflicts += 1
        except DispatchError as exc:
            self.errors += 1
            _log.warning("%s failed: %s; retrying", what, exc)
            asyncio.get_running_loop().call_later(1.0, retry)

    def _retry_checks(self) -> None:
        self._checks_dirty = True
        self._wake.set()

    def _retry(self, key: Key) -> Callable[[], None]:
        def again() -> None:
            self._queue.add(key)
            self._wake.set()

        return again

    async def _activate(self) -> None:
        for name in sorted(self.ours()):
            ac = self.checks.cache[("", name)]
            conditions = (ac.get("status") or {}).get("conditions") or []
            generation = meta_of(ac).get("generation")
            if any(
                isinstance(c, Mapping)
                and c.get("type") == "Active"
                and c.get("status") == "True"
                and c.get("observedGeneration") == generation
                for c in conditions
            ):
                continue
            condition: dict[str, Any] = {
                "type": "Active",
                "status": "True",
                "reason": "Active",
                "message": "dispatch-admission serves this check (holds of dispatch jobs)",
                "lastTransitionTime": _time(self._clock.now()),
            }
            if isinstance(generation, int):
                condition["observedGeneration"] = generation
            body = {
                "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
                "kind": "AdmissionCheck",
                "metadata": {"name": name, "resourceVersion": meta_of(ac).get("resourceVersion")},
                "status": {"conditions": [condition]},
            }
            path = ADMISSION_CHECKS.path(name=name, subresource="status")
            await self._write(path, body, f"mark AdmissionCheck {name!r} Active", self._retry_checks)

    async def _reconcile(self, key: Key) -> None:
        wl = self.workloads.cache.get(key)
        if wl is None:
            return
        ours = self.ours()
        states = [
            c
            for c in (wl.get("status") or {}).get("admissionChecks") or []
            if isinstance(c, Mapping) and c.get("name") in ours
        ]
        if not states:
            return
        owner = _owner(wl)
        trainjob: dict[str, Any] | None = None
        if owner is not None:
            trainjob = self.trainjobs.cache.get((key[0], owner[0]))
            if trainjob is None or (owner[1] and meta_of(trainjob).get("uid") != owner[1]):
                return  # its TrainJob is not in the cache yet (its event follows) or is gone
        now = _time(self._clock.now())
        entries: list[dict[str, Any]] = []
        changed = False
        for current in states:
            want = desired_check(wl, current, trainjob)
            entry = {
                "name": current["name"],
                "state": current.get("state", "Pending"),
                "message": current.get("message", ""),
                "lastTransitionTime": current.get("lastTransitionTime") or now,
            }
            if want is not None and (want.state, want.message) != (entry["state"], entry["message"]):
                changed = True
                if want.state != entry["state"]:
                    entry["lastTransitionTime"] = now
                entry["state"], entry["message"] = want.state, want.message
            entries.append(entry)
        if not changed:
            return
        body = {
            "apiVersion": f"{KUEUE_GROUP}/{KUEUE_VERSION}",
            "kind": "Workload",
            # The cached version we decided on is a precondition: a decision made on a stale Workload
            # (say, Retry written again after Kueue already reset the check) must not land.
            "metadata": {
                "name": key[1],
                "namespace": key[0],
                "resourceVersion": meta_of(wl).get("resourceVersion"),
            },
            "status": {"admissionChecks": entries},
        }
        path = WORKLOADS.path(key[0], key[1], "status")
        what = f"set admission checks of Workload {key[0]}/{key[1]}"
        _log.info("%s: %s", what, ", ".join(f"{e['name']}={e['state']}" for e in entries))
        await self._write(path, body, what, self._retry(key))


def _owner(wl: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the TrainJob that owns the Workload, if a TrainJob does."""
    for ref in meta_of(wl).get("ownerReferences") or []:
        if (
            isinstance(ref, Mapping)
            and ref.get("kind") == "TrainJob"
            and str(ref.get("apiVersion", "")).startswith(f"{TRAINER_GROUP}/")
        ):
            return str(ref.get("name", "")), str(ref.get("uid", ""))
    return None


async def _apply(client: KubeClient, path: str, body: Mapping[str, Any], *, what: str) -> None:
    await client.patch(
        path,
        body,
        what=what,
        content_type="application/apply-patch+yaml",
        params={"fieldManager": FIELD_MANAGER, "force": "true"},
    )


class AdmissionController:
    """``dispatch-admission`` in-process: ``await run()`` until :meth:`stop` (see the module docstring).

    The client's credentials need the rules in ``deploy/rbac.yaml``."""

    def __init__(
        self,
        client: KubeClient,
        *,
        lease: LeaseSettings | None = None,
        clock: Clock | None = None,
        server_timeout: int = 300,
    ) -> None:
        self._client = client
        self.lease = lease or LeaseSettings()
        self._clock = clock or SystemClock()
        self._server_timeout = server_timeout
        self.elector = LeaderElector(client, self.lease, self._clock)
        self.reconciler: _Reconciler | None = None
        self.leading = False
        self._stop = asyncio.Event()
        self._done = asyncio.Event()
        self._work: asyncio.Task[None] | None = None
        self._running = False

    def __repr__(self) -> str:
        return f"<AdmissionController {self.lease.identity} leading={self.leading}>"

    @property
    def stats(self) -> dict[str, int]:
        """Counters for metrics: lease transitions, writes, errors, conflicts (a write whose precondition
        failed: decided on a stale copy), lists, watches, events."""
        r = self.reconciler
        out = {"lease_transitions": self.elector.transitions, "writes": 0, "errors": 0, "conflicts": 0}
        if r is not None:
            out["writes"], out["errors"], out["conflicts"] = r.writes, r.errors, r.conflicts
            for inf in r.informers:
                for name in ("lists", "watches", "events"):
                    out[name] = out.get(name, 0) + getattr(inf, name)
        return out

    def idle(self) -> bool:
        """Leading with every informer synced and no work queued (for tests and readiness)."""
        r = self.reconciler
        return (
            self.leading and r is not None and all(i.synced.is_set() for i in r.informers) and not r.pending()
        )

    async def _lead(self) -> None:
        self.reconciler = _Reconciler(self._client, self._clock, self._server_timeout)
        self.leading = True
        metrics.current().set("dispatch_admission_leader", 1)
        _log.info("leading as %s", self.lease.identity)
        self._work = asyncio.create_task(self.reconciler.run())

    async def _follow(self) -> None:
        work, self._work = self._work, None
        if work is not None:
            work.cancel()
            # Wait for the work to end before anything else (client-go: code protected by the lease must
            # stop before it is given up); a cancellation of *this* task still propagates.
            await asyncio.wait([work])
            if not work.cancelled() and work.exception() is not None:
                _log.error("the reconciler failed: %s", work.exception())
        if self.leading:
            _log.info("stopped leading as %s", self.lease.identity)
        self.leading = False
        metrics.current().set("dispatch_admission_leader", 0)

    async def run(self) -> None:
        """Elect, lead, follow, until :meth:`stop`; then release the lease. Cancelling the task instead
        (a crash) stops acting at once and leaves the lease to expire."""
        if self._running:
            raise InvalidError("this AdmissionController is already running", path="run")
        self._running = True
        self._stop.clear()
        self._done.clear()
        last_renewal = self._clock.now()
        try:
            while not self._stop.is_set():
                # An attempt may not outlast the renew deadline (the client retries slow answers): a
                # leader must know it lost the lease before another replica may take it over.
                started = self._clock.now()
                budget = self.lease.renew_deadline
                if self.leading:
                    budget = max(0.001, budget - (started - last_renewal))
                try:
                    ok = await asyncio.wait_for(self.elector.try_acquire_or_renew(), budget)
                except (DispatchError, TimeoutError) as exc:
                    why = str(exc) or f"{type(exc).__name__} (no answer within {budget:.1f}s)"
                    _log.warning("lease %s/%s: %s", self.lease.namespace, self.lease.name, why)
                    ok = False
                now = self._clock.now()
                if ok:
                    # Counted from before the request: the lease says it was renewed no later than that.
                    last_renewal = started
                    if not self.leading:
                        await self._lead()
                elif self.leading and (
                    now - last_renewal >= self.lease.renew_deadline
                    or self.elector.holder not in ("", self.lease.identity)
                ):
                    await self._follow()  # lost the lease, or could not renew in time: stop acting
                if self._work is not None and self._work.done():
                    _log.error("the reconciler stopped; restarting it")
                    await self._follow()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), self.lease.retry_period)
            await self._follow()
            with contextlib.suppress(DispatchError):
                await self.elector.release()
        finally:
            await self._follow()
            self._running = False
            self._done.set()

    async def stop(self) -> None:
        """Stop acting and release the lease; returns when :meth:`run` has finished (at once if it is
        not running)."""
        self._stop.set()
        if self._running:
            await self._done.wait()


# --- the console script -------------------------------------------------------------------------------


def _in_cluster_namespace() -> str | None:
    try:
        with open("/var/run/secrets/kubernetes.io/serviceaccount/namespace") as f:
            return f.read().strip() or None
    except OSError:
        return None


def _check_states(body: Mapping[str, Any]) -> list[str]:
    """The admission check states a status write sets (for the metrics; a closed set of names)."""
    status = body.get("status")
    checks = status.get("admissionChecks") if isinstance(status, Mapping) else None
    out = []
    for check in checks if isinstance(checks, list) else []:
        state = check.get("state") if isinstance(check, Mapping) else None
        if state in ("Pending", "Ready", "Retry", "Rejected"):
            out.append(str(state))
    return out


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dispatch-admission",
        description=f"Kueue admission check controller for dispatch holds (controllerName {ADMISSION_CONTROLLER}).",
    )
    p.add_argument(
        "--kubeconfig", help="kubeconfig path (default: in-cluster, then $KUBECONFIG, ~/.kube/config)"
    )
    p.add_argument("--context", help="kubeconfig context (default: current)")
    p.add_argument(
        "--lease-namespace",
        default=os.environ.get("POD_NAMESPACE") or _in_cluster_namespace() or "dispatch-system",
        help="namespace of the leader-election Lease (default: $POD_NAMESPACE, the pod's, or dispatch-system)",
    )
    p.add_argument("--lease-name", default="dispatch-admission")
    p.add_argument("--identity", default=os.environ.get("POD_NAME") or _default_identity())
    p.add_argument("--lease-duration", type=float, default=15.0, help="seconds (default 15)")
    p.add_argument("--renew-deadline", type=float, default=10.0, help="seconds (default 10)")
    p.add_argument("--retry-period", type=float, default=2.0, help="seconds (default 2)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--log-format", default="text", choices=["text", "json"], help="log lines as text or JSON")
    p.add_argument(
        "--metrics-address",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (needs dispatch-train[metrics])",
    )
    return p


async def _serve(args: argparse.Namespace) -> None:
    lease = LeaseSettings(
        namespace=args.lease_namespace,
        name=args.lease_name,
        identity=args.identity,
        duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
    )
    client = KubeClient.connect(kubeconfig=args.kubeconfig, context=args.context)
    controller = AdmissionController(client, lease=lease)
    loop = asyncio.get_running_loop()
    stopping: set[asyncio.Task[None]] = set()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stopping.add(asyncio.ensure_future(controller.stop())))
    try:
        await controller.run()
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``dispatch-admission`` console script."""
    args = _parser().parse_args(argv)
    try:
        logs.configure(args.log_format, level=args.log_level.upper())
        if args.metrics_address:
            metrics.enable(args.metrics_address)
        asyncio.run(_serve(args))
    except DispatchError as exc:
        print(f"dispatch-admission: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
