"""What a read-only open learns about the cluster that does not change from one command to the next, kept
between processes: which APIs are served (Trainer, JobSet, Kueue), the TrainJob CRD's version as
preflight read it, and the cluster's identity (SPEC §6.1).

A read command (``dispatch status``, ``list``, ``logs``) opens the cluster read-only; learning these took
it five requests of its seven to ten (three API groups' discovery, the TrainJob CRD — 31 KB — and the
``kube-system`` namespace). kubectl keeps discovery on disk for six hours (client-go's disk cache under
``~/.kube/cache/discovery``); dispatch keeps these facts in the host's probe cache — the CLI's is the
store's key-value table, already open — next to the probe's findings (:mod:`dispatch_kubeflow.probecache`).

An entry is used only when all of this holds, else the facts are read anew and the entry replaced:

- it is younger than :data:`TTL` (ten minutes: an API installed or removed is seen within that; kubectl's
  is 6 h);
- it is of the same API server (its URL, the CA the configuration trusts — both in the key — and the
  certificate the server presents now, read from the connection the command opens anyway: a cluster made
  anew at the same address has a new one);
- discovery found nothing missing (a refusal is never cached: it is read, and said, every time).

The identity is kept only when it is the ``kube-system`` namespace's uid (credentials that may not read it
read the server's address instead, which must not be handed to other credentials as the cluster's name).
Opens that may write (the supervisor, ``submit``) always read everything: their preflight checks what they
are about to rely on.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any

from dispatch.errors import DispatchError
from dispatch.probecache import ProbeCache
from dispatch_kubeflow.kube import KubeClient
from dispatch_kubeflow.preflight import ClusterFacts, cluster_identity, discover
from dispatch_kubeflow.settings import Settings

__all__ = ["FORMAT", "TTL", "cache_key", "discover_cached"]

_log = logging.getLogger(__name__)

FORMAT = 1
"""The shape of an entry; another format is ignored and overwritten."""
TTL = 600.0
"""Seconds an entry is used."""


def cache_key(client: KubeClient, settings: Settings) -> str:
    """Where the facts of this API server (as the configuration trusts it) and settings live."""
    parts = [client.server, client.ca_fingerprint, settings.queue or ""]
    return "kubeflow-cluster/" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


async def discover_cached(
    client: KubeClient, settings: Settings, facts: ClusterFacts, cache: ProbeCache | None, *, now: float
) -> str:
    """:func:`~dispatch_kubeflow.preflight.discover` and the cluster's identity, from ``cache`` when an
    entry holds (see the module docstring), else read and kept. Returns the identity."""
    if cache is None:
        await discover(client, settings, facts)
        return await cluster_identity(client)
    key = cache_key(client, settings)
    certificate = await client.server_fingerprint()
    entry = await _get(cache, key)
    if entry is not None and _fresh(entry, certificate, now):
        facts.kueue = bool(entry["kueue"])
        facts.trainjob_crd = str(entry["trainjobCRD"])
        facts.notes += [str(n) for n in entry["notes"]]
        cluster = entry.get("cluster")
        if isinstance(cluster, str) and cluster:
            return cluster
        return await cluster_identity(client)
    notes_before = len(facts.notes)
    await discover(client, settings, facts)  # raises on a gap: nothing is kept
    cluster = await cluster_identity(client)
    kept = {
        "format": FORMAT,
        "at": now,
        "certificate": certificate,
        "kueue": facts.kueue,
        "trainjobCRD": facts.trainjob_crd,
        "notes": facts.notes[notes_before:],
        "cluster": cluster if _is_uid(cluster, client) else "",
    }
    try:
        await cache.put(key, kept)
    except DispatchError as exc:  # a cache is never the reason a cluster cannot be opened
        _log.info("could not keep the cluster's facts: %s", exc)
    return cluster


async def _get(cache: ProbeCache, key: str) -> Mapping[str, Any] | None:
    try:
        return await cache.get(key)
    except DispatchError:
        return None


def _fresh(entry: Mapping[str, Any], certificate: str, now: float) -> bool:
    at = entry.get("at")
    return (
        entry.get("format") == FORMAT
        and isinstance(at, int | float)
        and 0 <= now - at < TTL
        and entry.get("certificate") == certificate
        and isinstance(entry.get("kueue"), bool)
        and isinstance(entry.get("trainjobCRD"), str)
        and isinstance(entry.get("notes"), list)
    )


def _is_uid(cluster: str, client: KubeClient) -> bool:
    """The identity is the kube-system namespace's uid, not the server's address (the fallback)."""
    return not cluster.startswith(f"kubernetes:{client.server}")
