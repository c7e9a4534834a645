"""The one tolerant way to read a Kubernetes object (pure): a field of the wrong type, or a missing one,
reads as absent, so a malformed object never raises ``KeyError``/``TypeError`` in the adapter. The typed
views of :mod:`dispatch_kubeflow.causes` (``TrainJob``, ``Pod``, ``JobSet``, ``Workload``) are built on it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["as_map", "labels_of", "meta_of"]


def as_map(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a mapping, else an empty one."""
    return value if isinstance(value, Mapping) else {}


def meta_of(obj: Mapping[str, Any] | None) -> Mapping[str, Any]:
    """An object's ``metadata`` (empty when absent or not an object)."""
    return as_map(obj.get("metadata")) if obj is not None else {}


def labels_of(obj: Mapping[str, Any] | None) -> dict[str, str]:
    """An object's labels that are strings (anything else reads as absent)."""
    raw = as_map(meta_of(obj).get("labels"))
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}
