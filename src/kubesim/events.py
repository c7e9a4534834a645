"""Kubernetes Events as a cluster has them: what kubesim's components record goes through the client-go
recorder's correlator, and the API server forgets every Event some time after its last write.

- :class:`EventRecorder` is ``EventCorrelator`` of ``client-go/tools/record/events_cache.go``: a spam
  filter (a token bucket per source and object: 25 events, then one per 5 minutes; the rest are
  dropped), an aggregator (the 10th distinct message with the same source, object, type and reason
  within 10 minutes becomes one event "(combined from similar events): <message>"), and a logger that
  turns a repeat of the same event into a patch of the first one (``count`` + 1, ``lastTimestamp``).
  Events are named ``<object name>.<hex of the time in ns>`` as ``makeEvent`` names them.
- :class:`EventTTL` is the API server's ``--event-ttl`` (default 1 h): the Event registry gives every
  create *and* update a TTL (``pkg/registry/core/event/storage/storage.go``), so an Event disappears
  that long after it was last written, whoever wrote it.

Events are best effort, as on a cluster: a refused write is logged and forgotten.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubesim.clock import Clock, TimerHandle, stamp
from kubesim.errors import ApiError
from kubesim.resources import EVENTS

if TYPE_CHECKING:
    from kubesim.store import ObjectStore, WatchEvent

__all__ = ["DEFAULT_EVENT_TTL", "EventRecorder", "EventTTL"]

log = logging.getLogger("kubesim.events")

DEFAULT_EVENT_TTL = 3600.0
"""kube-apiserver's ``--event-ttl`` default (1 h)."""

_LRU_SIZE = 4096  # maxLruCacheEntries
_AGGREGATE_MAX = 10  # defaultAggregateMaxEvents
_AGGREGATE_INTERVAL = 600.0  # defaultAggregateIntervalInSeconds
_SPAM_BURST = 25.0  # defaultSpamBurst
_SPAM_QPS = 1.0 / 300.0  # defaultSpamQPS
COMBINED_PREFIX = "(combined from similar events): "


class _Lru(OrderedDict[str, Any]):
    """A bounded map that forgets the least recently used key (groupcache's ``lru.Cache``)."""

    def get_recent(self, key: str) -> Any:
        if key in self:
            self.move_to_end(key)
            return self[key]
        return None

    def put(self, key: str, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > _LRU_SIZE:
            self.popitem(last=False)


@dataclass
class _Bucket:
    tokens: float
    at: float


@dataclass
class _Similar:
    messages: set[str] = field(default_factory=set)
    last: float = 0.0


@dataclass
class _Seen:
    name: str
    namespace: str
    count: int
    first: str


def _ref(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    ref = {
        "apiVersion": obj.get("apiVersion"),
        "kind": obj.get("kind"),
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "uid": meta.get("uid"),
        "resourceVersion": meta.get("resourceVersion"),
    }
    return {k: v for k, v in ref.items() if v}


def _object_key(component: str, host: str, ref: dict[str, Any]) -> str:
    return (
        "\x00".join(str(ref.get(k) or "") for k in ("kind", "namespace", "name", "uid", "apiVersion"))
        + f"\x00{component}\x00{host}"
    )


class EventRecorder:
    """Records core/v1 Events for kubesim's components with client-go's correlation (see module doc).

    One recorder per simulator, shared by every component (each real component has its own; the caches
    are keyed by the source component, so the effect is the same)."""

    def __init__(self, store: ObjectStore, clock: Clock) -> None:
        self._store = store
        self._clock = clock
        self._spam = _Lru()
        self._similar = _Lru()
        self._seen = _Lru()
        self._seq = 0
        self.dropped = 0  # events the spam filter refused (a real recorder drops them silently)

    def __repr__(self) -> str:
        return f"EventRecorder(tracked={len(self._seen)}, dropped={self.dropped})"

    def record(
        self, obj: dict[str, Any], etype: str, reason: str, message: str, *, component: str, host: str = ""
    ) -> None:
        """Record that ``reason`` happened to ``obj`` (an Event in its namespace, ``default`` for a
        cluster-scoped object, as ``ref.Namespace`` empty → ``metav1.NamespaceDefault``)."""
        now = self._clock.now()
        ref = _ref(obj)
        obj_key = _object_key(component, host, ref)
        if not self._allow(obj_key, now):
            self.dropped += 1
            return
        similar_key = f"{obj_key}\x00{etype}\x00{reason}"
        similar = self._similar.get_recent(similar_key)
        if similar is None or now - similar.last > _AGGREGATE_INTERVAL:
            similar = _Similar()
        similar.messages.add(message)
        similar.last = now
        self._similar.put(similar_key, similar)
        key = f"{similar_key}\x00{message}"
        if len(similar.messages) >= _AGGREGATE_MAX:
            similar.messages.pop()  # as the aggregator: the set never grows past the maximum
            message = COMBINED_PREFIX + message
            key = similar_key  # every later similar event bumps the one aggregate event
        namespace = str(ref.get("namespace") or "default")
        written = stamp(self._clock, now)
        seen = self._seen.get_recent(key)
        if seen is not None and self._bump(seen, written, message):
            return
        self._seq += 1
        # named after the wall time, as makeEvent's t.UnixNano()
        name = f"{ref.get('name')}.{int(self._clock.wall(now) * 1e9) + self._seq:x}"
        event: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": ref,
            "reason": reason,
            "message": message,
            "type": etype,
            "source": {"component": component, **({"host": host} if host else {})},
            "reportingComponent": component,
            "reportingInstance": host,
            "firstTimestamp": written,
            "lastTimestamp": written,
            "count": 1,
            "eventTime": None,
        }
        try:
            self._store.create(EVENTS, event)
        except ApiError as e:
            log.debug("kubesim: event %s on %s not recorded: %s", reason, ref.get("name"), e.message)
            return
        self._seen.put(key, _Seen(name, namespace, 1, written))

    def _allow(self, key: str, now: float) -> bool:
        bucket = self._spam.get_recent(key)
        if bucket is None:
            bucket = _Bucket(_SPAM_BURST, now)
        bucket.tokens = min(_SPAM_BURST, bucket.tokens + (now - bucket.at) * _SPAM_QPS)
        bucket.at = now
        self._spam.put(key, bucket)
        if bucket.tokens < 1.0:
            return False
        bucket.tokens -= 1.0
        return True

    def _bump(self, seen: _Seen, written: str, message: str) -> bool:
        """Patch the first occurrence (``count`` + 1, ``lastTimestamp``); False when it is gone (expired
        or deleted), and then the caller creates a fresh one, as ``recordEvent`` does on NotFound."""
        seen.count += 1

        def bump(ev: dict[str, Any]) -> None:
            ev["count"] = seen.count
            ev["lastTimestamp"] = written
            ev["message"] = message

        try:
            self._store.mutate(EVENTS, seen.namespace, seen.name, bump)
        except ApiError as e:
            if e.code != 404:
                log.debug("kubesim: event %s not updated: %s", seen.name, e.message)
                return True
            return False
        return True


class EventTTL:
    """Deletes each Event ``ttl`` seconds after its last write (kube-apiserver's ``--event-ttl``)."""

    def __init__(self, store: ObjectStore, clock: Clock, ttl: float = DEFAULT_EVENT_TTL) -> None:
        if ttl <= 0:
            raise ValueError(f"event TTL must be > 0 seconds, got {ttl}")
        self.ttl = float(ttl)
        self._store = store
        self._clock = clock
        self._timers: dict[tuple[str, str], TimerHandle] = {}
        self._pending: dict[tuple[str, str], float] = {}
        store.subscribe(self._on_event, rt=EVENTS)

    def __repr__(self) -> str:
        return f"EventTTL(ttl={self.ttl}, tracked={len(self._timers) + len(self._pending)})"

    def _on_event(self, ev: WatchEvent) -> None:
        meta = ev.obj["metadata"]
        key = (str(meta.get("namespace") or ""), str(meta["name"]))
        old = self._timers.pop(key, None)
        if old is not None:
            old.cancel()
        self._pending.pop(key, None)
        if ev.type == "DELETED":
            return
        self._arm(key, self._clock.now() + self.ttl)

    def _arm(self, key: tuple[str, str], when: float) -> None:
        try:
            self._timers[key] = self._clock.call_at(when, lambda: self._expire(key))
        except RuntimeError:
            # A real clock needs a running loop: writes made before serving are armed by ``arm_pending``.
            self._pending[key] = when

    def arm_pending(self) -> None:
        """Arm the expiries of Events written while no event loop ran (called when the server starts)."""
        pending, self._pending = self._pending, {}
        for key, when in pending.items():
            self._arm(key, when)

    def _expire(self, key: tuple[str, str]) -> None:
        self._timers.pop(key, None)
        try:
            self._store.delete(EVENTS, key[0], key[1])
        except ApiError as e:
            if e.code != 404:
                log.debug("kubesim: expiring event %s/%s: %s", key[0], key[1], e.message)
