"""The adapter registry: one :class:`Adapter` descriptor per adapter, registered by import or discovered
through the entry-point group ``dispatch.adapters`` (so ``dispatch.open("kubeflow", ...)`` works without
importing the adapter).

Everything the host needs to know about an adapter — its factory, how it reads and documents its
settings, the extensions it accepts — is declared once, in its descriptor; ``dispatch.open``,
``dispatch schema`` and ``dispatch adapters`` all read it from here, and this is the one module that reads
entry points.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from msgspec import Struct
from msgspec.structs import force_setattr

from dispatch.backend import Backend
from dispatch.config import AdapterConfig
from dispatch.errors import InvalidError, NotFoundError, UnsupportedError

if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

__all__ = [
    "BUILTIN",
    "ENTRY_POINT_GROUP",
    "Adapter",
    "Factory",
    "adapters",
    "describe",
    "load_installed",
    "new_backend",
    "register",
]

ENTRY_POINT_GROUP = "dispatch.adapters"

BUILTIN = {
    "memory": "dispatch.memory:ADAPTER",
    "kubeflow": "dispatch_kubeflow:ADAPTER",
    "slurm": "dispatch_slurm:ADAPTER",
}
"""The adapters this distribution ships: its own entry points (a test holds them equal). :func:`describe`
finds these without reading every installed distribution's metadata (``importlib.metadata`` alone costs
a command about 0.05 s of CPU to import), so no plugin can take their names."""

Factory = Callable[[AdapterConfig], Awaitable[Backend]]
"""An adapter's factory: opens a backend from an :class:`AdapterConfig`."""


class Adapter(Struct, frozen=True):
    """An adapter, described once.

    ``parse_settings`` decodes and checks the settings bytes without touching a cluster (``InvalidError``
    naming the path); ``schema`` returns the JSON Schema (draft 2020-12) of the settings, for a host to
    publish; ``extensions`` names the job-spec extensions the adapter may accept (a cluster may accept
    fewer: see ``Capabilities.extensions``). An adapter registered with a bare factory has no settings
    parser or schema.
    """

    name: str
    factory: Factory
    parse_settings: Callable[[bytes], object] | None = None
    schema: Callable[[], dict[str, Any]] | None = None
    extensions: frozenset[str] = frozenset()
    summary: str = ""

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or not name or not name.replace("-", "").replace("_", "").isalnum():
            raise InvalidError(
                f"adapter names are non-empty words ([A-Za-z0-9_-]), got {name!r}", path="name"
            )
        for key in ("factory", "parse_settings", "schema"):
            value = getattr(self, key)
            if value is not None and not callable(value):
                raise InvalidError(f"expected a callable, got {type(value).__name__}", path=key)
        if not callable(self.factory):
            raise InvalidError("an adapter needs a factory", path="factory")
        if not isinstance(self.extensions, frozenset | set | tuple | list) or not all(
            isinstance(e, str) for e in self.extensions
        ):
            raise InvalidError(f"expected extension names, got {self.extensions!r}", path="extensions")
        force_setattr(self, "extensions", frozenset(self.extensions))

    def settings_schema(self) -> dict[str, Any]:
        """The settings schema; ``UnsupportedError`` when the adapter publishes none."""
        if self.schema is None:
            raise UnsupportedError(f"adapter {self.name!r} publishes no settings schema")
        value = self.schema()
        if not isinstance(value, dict):
            raise UnsupportedError(f"adapter {self.name!r}: its schema is not a JSON object")
        return value


_log = logging.getLogger(__name__)
_adapters: dict[str, Adapter] = {}


def register(adapter: Adapter | str, factory: Factory | None = None) -> Adapter:
    """Register an adapter's descriptor (``register(Adapter(...))``), or a bare factory under a name
    (``register(name, factory)``). Registering the same adapter again is a no-op (importing an adapter
    twice is harmless); another one under a taken name replaces it with a warning."""
    if isinstance(adapter, str):
        if factory is None:
            raise InvalidError("register(name, factory) needs a factory", path="factory")
        described = Adapter(adapter, factory)
    elif isinstance(adapter, Adapter):
        if factory is not None:
            raise InvalidError("pass an Adapter, or a name and a factory, not both", path="factory")
        described = adapter
    else:
        raise InvalidError(f"expected an Adapter or a name, got {type(adapter).__name__}", path="adapter")
    old = _adapters.get(described.name)
    if old is not None and old != described:
        _log.warning("adapter %r re-registered: %r replaces %r", described.name, described, old)
    _adapters[described.name] = described
    return described


def _entry_points() -> dict[str, EntryPoint]:
    # importlib.metadata costs tens of milliseconds to import: pay it only when a name is looked up.
    from importlib import metadata

    return {ep.name: ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)}


def adapters() -> list[str]:
    """Names of every adapter available: registered, or installed under the entry-point group."""
    return sorted(set(_adapters) | set(_entry_points()) | set(BUILTIN))


def _load_builtin(value: str) -> object:
    module, _, attr = value.partition(":")
    return getattr(importlib.import_module(module), attr)


def _load(name: str, ep: EntryPoint | str) -> Adapter:
    value = ep if isinstance(ep, str) else ep.value
    try:
        loaded = _load_builtin(ep) if isinstance(ep, str) else ep.load()
    except Exception as exc:  # a broken plugin must not take the host down with a bare traceback
        raise NotFoundError(
            f"adapter {name!r} ({value}) failed to load: {type(exc).__name__}: {exc}"
        ) from exc
    # Importing the adapter usually registers it; otherwise the entry point names its descriptor or,
    # for a minimal plugin, its factory.
    if name in _adapters:
        return _adapters[name]
    if isinstance(loaded, Adapter):
        return register(loaded)
    if callable(loaded):
        return register(name, loaded)
    raise NotFoundError(f"adapter {name!r}: entry point {value} is neither an Adapter nor a factory")


def describe(name: str) -> Adapter:
    """The descriptor of adapter ``name`` (loading it through its entry point if needed)."""
    if name in _adapters:
        return _adapters[name]
    if name in BUILTIN:
        return _load(name, BUILTIN[name])
    ep = _entry_points().get(name)
    if ep is None:
        known = ", ".join(adapters()) or "none"
        raise NotFoundError(f"no adapter named {name!r}; available: {known}")
    return _load(name, ep)


def load_installed() -> list[Adapter]:
    """Load every installed adapter (so that its extension types decode); a plugin that fails to load
    is logged and left out."""
    out: list[Adapter] = []
    found: dict[str, EntryPoint | str] = {**_entry_points(), **BUILTIN}
    for name, ep in found.items():
        try:
            out.append(_adapters[name] if name in _adapters else _load(name, ep))
        except NotFoundError as exc:
            _log.warning("%s", exc)
    known = {a.name for a in out}
    out += [a for n, a in _adapters.items() if n not in known]
    return sorted(out, key=lambda a: a.name)


async def new_backend(name: str, cfg: AdapterConfig) -> Backend:
    """Build the backend of adapter ``name`` alone, for a host that composes its own supervisor."""
    if not isinstance(cfg, AdapterConfig):
        raise InvalidError(f"expected a dispatch.AdapterConfig, got {type(cfg).__name__}", path="cfg")
    adapter = describe(name)
    if cfg.backend != name:
        raise InvalidError(f"AdapterConfig names adapter {cfg.backend!r}, not {name!r}", path="backend")
    backend = await adapter.factory(cfg)
    if not isinstance(backend, Backend):
        raise NotFoundError(f"adapter {name!r} returned {type(backend).__name__}, which is not a Backend")
    return backend


_BACKEND_MEMBERS = (
    "name",
    "cluster_id",
    "capabilities",
    "prepare",
    "start",
    "observe",
    "stop",
    "list",
    "close",
)
"""What :class:`~dispatch.backend.Backend` requires, to name what a returned object lacks."""
