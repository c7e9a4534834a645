"""Committed changes and the bounded watch history: what the API server's watch cache keeps per resource
type (``staging/src/k8s.io/apiserver/pkg/storage/cacher``) and what etcd compaction takes away. A resume
from before the retained window is answered 410 Expired, one from the future 504 (too large)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from kubesim.errors import ApiError, bad_request, expired
from kubesim.resources import REGISTRY, ResourceType

__all__ = ["EventType", "WatchEvent", "WatchHistory"]

EventType = Literal["ADDED", "MODIFIED", "DELETED"]


@dataclass(frozen=True)
class WatchEvent:
    """A committed change: ``obj`` is the object after it (for DELETED, its last state with the deletion's
    resourceVersion); ``old`` the object before (None for ADDED). Read-only."""

    type: EventType
    rt: ResourceType
    obj: dict[str, Any]
    old: dict[str, Any] | None

    @property
    def resource_version(self) -> int:
        return int(self.obj["metadata"]["resourceVersion"])

    @property
    def namespace(self) -> str | None:
        ns = self.obj["metadata"].get("namespace")
        return ns if isinstance(ns, str) else None

    def __repr__(self) -> str:
        m = self.obj.get("metadata", {})
        return (
            f"WatchEvent({self.type} {self.rt.kind} {m.get('namespace', '')}/{m.get('name')} "
            f"rv={m.get('resourceVersion')})"
        )


class WatchHistory:
    """The last ``limit`` changes of each resource type, and where each type's history was cut."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"history_limit must be >= 1, got {limit}")
        self.limit = limit
        self._events: dict[ResourceType, deque[WatchEvent]] = {}
        self._compacted: dict[ResourceType, int] = {}

    def record(self, ev: WatchEvent) -> None:
        hist = self._events.get(ev.rt)
        if hist is None:
            hist = self._events[ev.rt] = deque()
        if len(hist) >= self.limit:
            dropped = hist.popleft()
            self._compacted[ev.rt] = dropped.resource_version
        hist.append(ev)

    def since(
        self, rt: ResourceType, namespace: str | None, resource_version: str | int, current: int
    ) -> list[WatchEvent]:
        """Changes of ``rt`` (in ``namespace``, or all) after ``resource_version``, oldest first; 410 when
        the retained history no longer reaches back to it, 504 when it is after ``current``."""
        try:
            rv = int(resource_version)
        except (TypeError, ValueError) as exc:
            raise bad_request(f"invalid resource version: {resource_version!r}") from exc
        compacted = self._compacted.get(rt, 0)
        if rv < compacted:
            raise expired(f"too old resource version: {rv} ({compacted})")
        if rv > current:
            raise ApiError(
                504,
                "Timeout",
                f"Timeout: Too large resource version: {rv}, current: {current}",
                details={
                    "causes": [
                        {"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}
                    ],
                    "retryAfterSeconds": 1,
                },
            )
        hist = self._events.get(rt)
        if not hist:
            return []
        out: list[WatchEvent] = []
        # Walk backwards from the newest: cost is proportional to the events returned, not the window.
        for ev in reversed(hist):
            if ev.resource_version <= rv:
                break
            if namespace is None or ev.namespace == namespace:
                out.append(ev)
        out.reverse()
        return out

    def expire_before(self, resource_version: int) -> None:
        """Every resourceVersion older than ``resource_version`` becomes too old to watch from (410)."""
        for rt in REGISTRY.values():
            self._compacted[rt] = max(self._compacted.get(rt, 0), resource_version)

    def compact(self, current: int) -> None:
        """Drop all history: resuming from any resourceVersion before ``current`` gives 410."""
        for rt in list(self._events) + list(REGISTRY.values()):
            self._events.pop(rt, None)
            self._compacted[rt] = current
