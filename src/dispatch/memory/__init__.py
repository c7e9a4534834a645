"""The ``memory`` adapter: an in-process backend that behaves like a small cluster.

Importing this package registers it as ``"memory"`` (it is also found through the ``dispatch.adapters``
entry point). It queues jobs for capacity, holds them, runs them through ``starting`` and ``running`` to
an outcome with a typed cause and evidence, and injects the faults a real cluster has (preemption,
eviction, node loss, OOM, exit codes, timeouts, image pulls, slow cessation) from a script the job
carries (``env["KUBESIM_SCRIPT"]``) or from the Python API (:meth:`MemoryBackend.inject` and friends).
Time comes from an injectable clock and nothing runs in the background, so tests with
:class:`~dispatch.clock.ManualClock` are fast and deterministic. See ``docs/memory-adapter.md``.
"""

from __future__ import annotations

from dispatch.config import AdapterConfig
from dispatch.memory.backend import ACCEPTED_EXTENSIONS, NAME, MemoryBackend
from dispatch.memory.cluster import MemoryCluster, Overlap
from dispatch.memory.naming import identity_of, native_name
from dispatch.memory.script import DEFAULT_SCRIPT, SCRIPT_ENV, parse_script
from dispatch.memory.settings import MemorySettings, parse_settings, schema
from dispatch.registry import Adapter, register

Settings = MemorySettings
"""The adapter's settings type under the name every adapter exports (``dispatch_kubeflow.Settings``)."""

__all__ = [
    "ACCEPTED_EXTENSIONS",
    "ADAPTER",
    "DEFAULT_SCRIPT",
    "NAME",
    "SCRIPT_ENV",
    "MemoryBackend",
    "MemoryCluster",
    "MemorySettings",
    "Overlap",
    "Settings",
    "factory",
    "identity_of",
    "native_name",
    "parse_script",
    "parse_settings",
    "schema",
]


async def factory(cfg: AdapterConfig) -> MemoryBackend:
    """Open a memory backend from an :class:`AdapterConfig` (settings decoded strictly; the system
    clock). The token, if any, is ignored: the memory cluster has no authentication."""
    settings = parse_settings(cfg.settings)
    return MemoryBackend(settings, read_only=cfg.read_only, store_id=cfg.store_id)


ADAPTER = register(
    Adapter(
        NAME,
        factory,
        parse_settings=parse_settings,
        schema=schema,
        extensions=ACCEPTED_EXTENSIONS,
        summary="an in-process cluster for tests and demos (jobs are scripted, not run)",
    )
)
"""The ``memory`` adapter's descriptor (also the ``dispatch.adapters`` entry point)."""
