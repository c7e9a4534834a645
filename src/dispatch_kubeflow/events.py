"""Kubernetes Events for dispatch's decisions about an incarnation (pure): the body of one core/v1
Event on the incarnation's TrainJob, as ``kubectl describe trainjob`` lists them.

One Event per decision (no client-side aggregation: decisions about one incarnation are few and each
names its epoch), named like client-go's (``<object>.<hex nanoseconds>``), from component ``dispatch``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = ["COMPONENT", "MAX_MESSAGE", "decision_event", "events_path"]

COMPONENT = "dispatch"
"""The Event's source component (``kubectl describe``'s From column)."""

MAX_MESSAGE = 1024
"""The longest message kept (the API server's limit for events.k8s.io; core/v1 clients keep to it)."""


def events_path(namespace: str) -> str:
    return f"/api/v1/namespaces/{namespace}/events"


def decision_event(
    trainjob: Mapping[str, Any], reason: str, message: str, *, warning: bool, at: float
) -> dict[str, Any]:
    """The Event recording decision ``reason`` (CamelCase) about ``trainjob`` at ``at`` (Unix seconds)."""
    meta = trainjob.get("metadata") or {}
    name, namespace = str(meta.get("name", "")), str(meta.get("namespace", ""))
    stamp = datetime.fromtimestamp(at, UTC)
    text = message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{name}.{int(at * 1e9):x}", "namespace": namespace},
        "involvedObject": {
            "apiVersion": str(trainjob.get("apiVersion", "")),
            "kind": str(trainjob.get("kind", "TrainJob")),
            "name": name,
            "namespace": namespace,
            "uid": str(meta.get("uid", "")),
            "resourceVersion": str(meta.get("resourceVersion", "")),
        },
        "reason": reason,
        "message": text,
        "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "firstTimestamp": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "lastTimestamp": stamp.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "count": 1,
    }
