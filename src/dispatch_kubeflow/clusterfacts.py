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
from collections.abc import Mapping
from typing import Any

from dispatch.probecache import ProbeCache, keep, lookup
from dispatch_kubeflow.kube import KubeClient
from dispatch_kubeflow.preflight import ClusterFacts, cluster_identity, discover
from dispatch_kubeflow.settings import Settings

__all__ = ["FORMAT", "TTL", "cache_key", "discover_cached"]

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
    entry = await lookup(cache, key, format=FORMAT, ttl=TTL, now=now)
    if entry is not None and _whole(entry, certificate):
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
        "certificate": certificate,
        "kueue": facts.kueue,
        "trainjobCRD": facts.trainjob_crd,
        "notes": facts.notes[notes_before:],
        "cluster": cluster if _is_uid(cluster, client) else "",
    }
    await keep(cache, key, kept, format=FORMAT, now=now)
    return cluster


def _whole(entry: Mapping[str, Any], certificate: str) -> bool:
    """A fresh entry (:func:`~dispatch.probecache.lookup` checked its format and age) is used when the
    server presents the certificate it was kept with and every fact is there, of its type."""
    return (
        entry.get("certificate") == certificate
        and isinstance(entry.get("kueue"), bool)
        and isinstance(entry.get("trainjobCRD"), str)
        and isinstance(entry.get("notes"), list)
    )


def _is_uid(cluster: str, client: KubeClient) -> bool:
    """The identity is the kube-system namespace's uid, not the server's address (the fallback)."""
    return not cluster.startswith(f"kubernetes:{client.server}")
