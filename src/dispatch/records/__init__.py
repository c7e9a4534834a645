"""Records: the durable job records dispatch keeps, whatever the cluster garbage-collects.

:class:`Store` is the protocol; :class:`SqliteStore` (the embedded default, one host),
:class:`PostgresStore` (several hosts; ``pip install 'dispatch-train[postgres]'``) and :class:`MemoryStore`
(tests) implement it, the optional change-notification hook :class:`ChangeNotifier`, and the optional
:class:`KeyValues` (a small table for host caches). The implementations load on first use, so
``import dispatch`` imports neither ``sqlite3`` nor ``psycopg``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dispatch.records.store import (
    ChangeNotifier,
    Changes,
    KeyValues,
    Leasing,
    Listing,
    Store,
    Unreadable,
    store_identity,
)

if TYPE_CHECKING:
    from dispatch.records.memory import MemoryStore
    from dispatch.records.paths import default_store_path
    from dispatch.records.postgres import PostgresStore
    from dispatch.records.sqlite import SqliteStore

__all__ = [
    "ChangeNotifier",
    "Changes",
    "KeyValues",
    "Leasing",
    "Listing",
    "MemoryStore",
    "PostgresStore",
    "SqliteStore",
    "Store",
    "Unreadable",
    "default_store_path",
    "store_identity",
]

_LAZY = {
    "MemoryStore": "dispatch.records.memory",
    "SqliteStore": "dispatch.records.sqlite",
    "PostgresStore": "dispatch.records.postgres",
    "default_store_path": "dispatch.records.paths",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    try:
        loaded = importlib.import_module(module)
    except ImportError as exc:
        if exc.name is None or not exc.name.startswith(("psycopg", "psycopg_pool")):
            raise
        from dispatch.errors import UnsupportedError

        raise UnsupportedError(
            f"{name} needs psycopg 3 and psycopg_pool, which are not installed: "
            "pip install 'dispatch-train[postgres]'"
        ) from None
    value = getattr(loaded, name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
