"""Reusing the gated probe's findings (SPEC §9.3): the fingerprint they depend on, and their shape.

The probe learns how the cluster *behaves* (the Trainer controller reconciles, Kueue takes jobs, probe
pods are visible, their logs readable). That changes when the cluster changes, so the findings are kept
with a fingerprint of what they depend on — the API server (URL and version), the Trainer TrainJob CRD
(its generation and resourceVersion as preflight's schema check read them, when the credentials can
read CRDs, else the Trainer API's discovery), the probe runtime's resourceVersion, and whether the
credentials may list pods and read their logs — and are reused only while every part is the same and
``probeTTL`` has not passed. What the credentials may do is asked again on every open (the access
review is cheap, and permissions change without any fingerprint moving).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import Any

from dispatch.errors import DispatchError, UnavailableError
from dispatch.probecache import ProbeCache
from dispatch_kubeflow.kube import KubeClient
from dispatch_kubeflow.names import TRAINER_GROUP, TRAINER_VERSION
from dispatch_kubeflow.preflight import ClusterFacts
from dispatch_kubeflow.settings import Settings

__all__ = ["FORMAT", "apply", "cache_key", "findings", "fingerprint", "lookup", "remember"]

_log = logging.getLogger(__name__)

FORMAT = 2
"""The shape of a cached entry; an entry of another format is ignored (and overwritten). 2: "pods visible:
no" means a refused listing only (format 1 also wrote it when no probe pod appeared in the window, which
left every job reading "starting"; such findings must not be reused)."""

_LEARNED = ("trainer_reconciles", "kueue_takes_jobs", "pods_visible", "logs_readable")


def cache_key(server: str, settings: Settings) -> str:
    """Where the findings for this API server, namespace, probe runtime and queue live."""
    ref = settings.probe_runtime
    parts = [server, settings.namespace, ref.kind, ref.runtime, settings.queue or ""]
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]
    return f"kubeflow/{digest}"


async def fingerprint(client: KubeClient, runtime: Mapping[str, Any], facts: ClusterFacts) -> dict[str, str]:
    """What the findings depend on, as the cluster shows it now: the CRD as ``discover`` read it (else
    the Trainer API's discovery), the probe runtime already read, and one or two more reads."""
    try:
        version = await client.get_or_none("/version", what="get the API server version") or {}
    except UnavailableError:
        raise
    except DispatchError:
        version = {}  # readable by every authenticated user on a default cluster; not on every cluster
    crd = facts.trainjob_crd
    if not crd:  # CRDs are often not readable by job submitters: fall back to discovery
        served = await client.served(TRAINER_GROUP, TRAINER_VERSION)
        crd = "discovery=" + ",".join(sorted(served or ()))
    return {
        "server": client.server,
        "serverVersion": str(version.get("gitVersion", "")),
        "trainjobCRD": crd,
        "probeRuntime": str(runtime.get("metadata", {}).get("resourceVersion", "")),
        # What the probe learns about pods and logs depends on whether these credentials may read them
        # (the access review, asked on every open, just before): a change of permissions probes again.
        "access": f"pods={facts.pods_visible},logs={facts.logs_readable}",
    }


async def lookup(
    cache: ProbeCache, key: str, print_: Mapping[str, str], *, now: float, ttl: float
) -> tuple[dict[str, Any], float] | None:
    """The cached findings and when they were learned, when they match ``print_`` and are younger than
    ``ttl``; else ``None``."""
    try:
        entry = await cache.get(key)
    except DispatchError:  # a broken cache is never the reason a cluster cannot be opened
        return None
    if not isinstance(entry, Mapping) or entry.get("format") != FORMAT:
        return None
    at = entry.get("at")
    if entry.get("fingerprint") != dict(print_) or not isinstance(at, int | float):
        return None
    if not 0 <= now - at < ttl:
        return None
    facts = entry.get("facts")
    return (dict(facts), float(at)) if isinstance(facts, Mapping) else None


def apply(facts: ClusterFacts, found: Mapping[str, Any], at: float) -> None:
    """Set what the probe would have learned from cached ``found``."""
    for name in _LEARNED:
        value = found.get(name)
        if value is None or isinstance(value, bool):
            setattr(facts, name, value)
    notes = found.get("notes")
    if isinstance(notes, list):
        facts.notes += [str(n) for n in notes]
    facts.probe_ceased = True
    facts.probed_at = at
    facts.from_cache = True


def findings(facts: ClusterFacts, notes_before: int) -> dict[str, Any]:
    """What the probe learned, to be cached (the notes it added, not the access review's)."""
    out: dict[str, Any] = {name: getattr(facts, name) for name in _LEARNED}
    out["notes"] = list(facts.notes[notes_before:])
    return out


async def remember(
    cache: ProbeCache, key: str, print_: Mapping[str, str], found: Mapping[str, Any], *, now: float
) -> None:
    """Store the findings with their fingerprint and time."""
    entry = {"format": FORMAT, "at": now, "fingerprint": dict(print_), "facts": dict(found)}
    json.dumps(entry)  # fail here, not in the store, if something is not JSON
    try:
        await cache.put(key, entry)
    except DispatchError as exc:
        _log.warning("could not keep the probe findings: %s", exc)
