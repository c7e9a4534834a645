"""Probe caches: where a host keeps what an adapter's preflight probe learned (SPEC §9.3).

An adapter whose factory runs a slow probe (Kubeflow: ≥ 10 s with a TrainJob created and deleted), or reads
facts that do not change from one open to the next (Kubeflow's API discovery; Slurm's configuration, two
``scontrol`` RPCs to slurmctld), may reuse earlier findings when the host hands it a :class:`ProbeCache` in
:attr:`~dispatch.config.AdapterConfig.probe_cache`. The adapter decides what the findings are, what
they depend on (a fingerprint it stores with them) and how long they stay good; the host only keeps
them. Without a cache the adapter probes every time, as the SPEC says.

- :class:`StoreProbeCache` keeps findings in a store's key-value table
  (:class:`~dispatch.records.store.KeyValues`), so every process sharing the store shares them: this
  is what the CLI and the supervisor hand the factory.
- :class:`MemoryProbeCache` keeps them in the process (tests, notebooks).
- ``refresh=True`` on either makes every lookup miss while still storing new findings: the next open
  probes again (``dispatch check --refresh``).

An adapter reads and writes its entries through :func:`lookup` and :func:`keep`, which hold what every
entry shares: a format and the time it was kept, checked on the way in (an entry of another format, or not
younger than the adapter's TTL, is a miss), and a cache that fails is a miss on the way in and a log line on
the way out — a cache is never the reason a cluster cannot be opened. What else makes an entry good (a
fingerprint, the settings) the adapter checks on what :func:`lookup` returns.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from dispatch.errors import DispatchError, InvalidError
from dispatch.records.store import KeyValues

__all__ = ["PROBE_PREFIX", "MemoryProbeCache", "ProbeCache", "StoreProbeCache", "keep", "lookup"]

_log = logging.getLogger(__name__)

PROBE_PREFIX = "probe/"
"""Keys of probe findings in a store's key-value table start with this."""


@runtime_checkable
class ProbeCache(Protocol):
    """Findings (a JSON object) by key. ``get`` returns ``None`` when there are none (or on refresh)."""

    async def get(self, key: str) -> Mapping[str, Any] | None:
        """The findings stored under ``key``, or ``None``."""
        ...

    async def put(self, key: str, findings: Mapping[str, Any]) -> None:
        """Store ``findings`` (JSON-serialisable) under ``key``, replacing what was there."""
        ...


def _encode(findings: Mapping[str, Any]) -> str:
    try:
        return json.dumps(dict(findings), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidError(f"probe findings are not JSON-serialisable: {exc}", path="findings") from None


class MemoryProbeCache:
    """A :class:`ProbeCache` in process memory."""

    def __init__(self, *, refresh: bool = False) -> None:
        self.refresh = refresh
        self._values: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"MemoryProbeCache({len(self._values)} entries{', refresh' if self.refresh else ''})"

    async def get(self, key: str) -> Mapping[str, Any] | None:
        text = None if self.refresh else self._values.get(key)
        return None if text is None else dict(json.loads(text))

    async def put(self, key: str, findings: Mapping[str, Any]) -> None:
        self._values[key] = _encode(findings)


class StoreProbeCache:
    """A :class:`ProbeCache` in a store's key-value table (keys prefixed ``probe/``).

    A corrupt entry reads as none (the adapter probes and overwrites it): a cache must never be the
    reason a cluster cannot be opened."""

    def __init__(self, store: KeyValues, *, refresh: bool = False) -> None:
        if not isinstance(store, KeyValues):
            raise InvalidError(
                f"{type(store).__name__} keeps no key-value table (get_value/put_value)", path="store"
            )
        self.store = store
        self.refresh = refresh

    def __repr__(self) -> str:
        return f"StoreProbeCache({self.store!r}{', refresh' if self.refresh else ''})"

    async def get(self, key: str) -> Mapping[str, Any] | None:
        if self.refresh:
            return None
        text = await self.store.get_value(PROBE_PREFIX + key)
        if text is None:
            return None
        try:
            value = json.loads(text)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    async def put(self, key: str, findings: Mapping[str, Any]) -> None:
        await self.store.put_value(PROBE_PREFIX + key, _encode(findings))


async def lookup(
    cache: ProbeCache, key: str, *, format: int, ttl: float, now: float
) -> dict[str, Any] | None:
    """The entry :func:`keep` wrote under ``key``, when it is a JSON object of ``format`` whose ``"at"``
    (a number; the entry's other fields are the adapter's to check) is less than ``ttl`` seconds before
    ``now``, and not after it; else ``None`` — also when ``cache`` raises a :class:`DispatchError` (logged)."""
    try:
        entry = await cache.get(key)
    except DispatchError as exc:  # a cache is never the reason a cluster cannot be opened
        _log.info("could not read %s from the probe cache: %s", key, exc)
        return None
    if not isinstance(entry, Mapping) or entry.get("format") != format:
        return None
    at = entry.get("at")
    if isinstance(at, bool) or not isinstance(at, int | float) or not 0 <= now - at < ttl:
        return None
    return dict(entry)


async def keep(cache: ProbeCache, key: str, fields: Mapping[str, Any], *, format: int, now: float) -> None:
    """Store ``fields`` (JSON-serialisable) under ``key`` as an entry of ``format`` kept at ``now`` (the
    entry's ``"format"`` and ``"at"``, which :func:`lookup` checks). A cache that raises a
    :class:`DispatchError` is logged, never raised: the findings are read again next time."""
    try:
        await cache.put(key, {**fields, "format": format, "at": now})
    except DispatchError as exc:  # a cache is never the reason a cluster cannot be opened
        _log.info("could not keep %s in the probe cache: %s", key, exc)
