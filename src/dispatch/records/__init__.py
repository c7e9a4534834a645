"""Records: the durable job records dispatch keeps, whatever the cluster garbage-collects.

:class:`Store` is the protocol; :class:`SqliteStore` (the embedded default) and :class:`MemoryStore`
(tests) implement it, and the optional :class:`KeyValues` (a small table for host caches) too. The implementations load on first use, so ``import dispatch`` does not import
``sqlite3``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dispatch.records.store import KeyValues, Store

if TYPE_CHECKING:
    from dispatch.records.memory import MemoryStore
    from dispatch.records.paths import default_store_path
    from dispatch.records.sqlite import SqliteStore

__all__ = ["KeyValues", "MemoryStore", "SqliteStore", "Store", "default_store_path"]

_LAZY = {
    "MemoryStore": "dispatch.records.memory",
    "SqliteStore": "dispatch.records.sqlite",
    "default_store_path": "dispatch.records.paths",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
