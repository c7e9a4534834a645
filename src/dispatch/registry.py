"""The adapter registry: adapters register by import, or are discovered through the entry-point group
``dispatch.adapters`` (so ``dispatch.open("kubeflow", ...)`` works without importing the adapter)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from dispatch.backend import Backend
from dispatch.config import AdapterConfig
from dispatch.errors import InvalidError, NotFoundError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = ["ENTRY_POINT_GROUP", "Factory", "adapters", "new_backend", "register"]

ENTRY_POINT_GROUP = "dispatch.adapters"

Factory = Callable[[AdapterConfig], Awaitable[Backend]]
"""An adapter's factory: opens a backend from an :class:`AdapterConfig`."""

_log = logging.getLogger(__name__)
_factories: dict[str, Factory] = {}


def register(name: str, factory: Factory) -> None:
    """Register ``factory`` under ``name``. Registering the same factory again is a no-op (importing an
    adapter twice is harmless); another factory under a taken name replaces it with a warning."""
    if not isinstance(name, str) or not name or not name.replace("-", "").replace("_", "").isalnum():
        raise InvalidError(f"adapter names are non-empty words ([A-Za-z0-9_-]), got {name!r}", path="name")
    if not callable(factory):
        raise InvalidError(f"expected a callable factory, got {type(factory).__name__}", path="factory")
    old = _factories.get(name)
    if old is not None and old is not factory:
        _log.warning("adapter %r re-registered: %r replaces %r", name, factory, old)
    _factories[name] = factory


def _entry_points() -> dict[str, EntryPoint]:
    # importlib.metadata costs tens of milliseconds to import: pay it only when a name is looked up.
    from importlib import metadata

    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def adapters() -> list[str]:
    """Names of every adapter available: registered, or installed under the entry-point group."""
    return sorted(set(_factories) | set(_entry_points()))


def _factory(name: str) -> Factory:
    if name in _factories:
        return _factories[name]
    ep = _entry_points().get(name)
    if ep is None:
        known = ", ".join(adapters()) or "none"
        raise NotFoundError(f"no adapter named {name!r}; available: {known}")
    try:
        loaded = ep.load()
    except Exception as exc:  # a broken plugin must not take the host down with a bare traceback
        raise NotFoundError(
            f"adapter {name!r} ({ep.value}) failed to load: {type(exc).__name__}: {exc}"
        ) from exc
    # Importing the adapter usually registers it; otherwise the entry point names the factory itself.
    factory = _factories.get(name)
    if factory is None:
        if not callable(loaded):
            raise NotFoundError(f"adapter {name!r}: entry point {ep.value} is not a factory")
        factory = loaded
        _factories[name] = factory
    return factory


async def new_backend(name: str, cfg: AdapterConfig) -> Backend:
    """Build the backend of adapter ``name`` alone, for a host that composes its own supervisor."""
    if not isinstance(cfg, AdapterConfig):
        raise InvalidError(f"expected a dispatch.AdapterConfig, got {type(cfg).__name__}", path="cfg")
    factory = _factory(name)
    if cfg.backend != name:
        raise InvalidError(f"AdapterConfig names adapter {cfg.backend!r}, not {name!r}", path="backend")
    backend = await factory(cfg)
    if not isinstance(backend, Backend):
        raise NotFoundError(f"adapter {name!r} returned {type(backend).__name__}, which is not a Backend")
    return backend
