"""What opening reads of a Slurm cluster, kept between processes in the host's probe cache.

Opening reads the cluster with two ``scontrol`` (``show config``, ``show partition``: each an RPC that
slurmctld serves), the same answers every time until an administrator changes the configuration. As the
Kubeflow adapter keeps its cluster facts (:mod:`dispatch_kubeflow.clusterfacts`), dispatch keeps them in the
host's :class:`~dispatch.probecache.ProbeCache` — the CLI's is the store's key-value table, a script's
whatever ``Config(probe_cache=...)`` it passes (none: read every time) —, so an open that finds them there
runs one Slurm command instead of two: ``scontrol ping``, whether slurmctld answers (the cheapest request
it serves: no job, node or partition data), so an outage still fails the open.

An entry is used only when all of this holds, else the cluster is read anew and the entry replaced:

- it is younger than :data:`TTL` (ten minutes, as the Kubeflow adapter's facts: a partition added or
  accounting turned on is seen within that);
- it is of the same cluster as these settings reach it: the key is where the commands run (local, or the
  ssh login node and user), the ``slurm.conf`` they use and the settings the facts depend on (partition,
  container, workdir); and the fingerprint stored with it — the ``slurm.conf`` the commands read, hashed,
  read with one ``cat`` (not a Slurm command) — is the one read now: a cluster made anew at the same
  place, on another port or with accounting turned on, has another configuration;
- it decodes whole (a corrupt, partial or older-format entry is ignored and overwritten: a cache is
  never the reason a cluster cannot be opened, nor the source of a wrong fact);
- the settings pass against it (a partition it does not list is read again, not refused from the cache:
  a refusal is always Slurm's answer of now).

Where the ``slurm.conf`` cannot be read (a configless site: the nodes fetch it from slurmctld) nothing is
kept and every open reads the cluster. ``dispatch check --refresh`` reads it again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from collections.abc import Mapping
from typing import Any

from dispatch.errors import DispatchError
from dispatch.probecache import ProbeCache, keep, lookup
from dispatch_slurm.preflight import ClusterInfo, Partition, check_settings, read_cluster
from dispatch_slurm.settings import Settings
from dispatch_slurm.transport import LocalTransport, SshTransport

__all__ = ["FORMAT", "TTL", "cache_key", "fingerprint", "read_cached"]

_log = logging.getLogger(__name__)

FORMAT = 1
"""The shape of an entry; another format is ignored and overwritten."""
TTL = 600.0
"""Seconds an entry is used."""

_CONF = 'exec cat -- "${SLURM_CONF:-/etc/slurm/slurm.conf}"'
_FACTS = frozenset(f.name for f in dataclasses.fields(ClusterInfo)) - {"kept_since"}


def cache_key(settings: Settings, transport: LocalTransport | SshTransport) -> str:
    """Where the facts of the cluster these settings reach, as they reach it, live."""
    if isinstance(transport, SshTransport):
        ssh = settings.ssh
        where = [
            "ssh",
            ssh.host if ssh else "",
            str(ssh.port if ssh else ""),
            (ssh.user or "") if ssh else "",
        ]
        conf, home = settings.slurm_conf or "", ""
    else:
        where = ["local", str(os.getuid())]
        conf = settings.slurm_conf or os.environ.get("SLURM_CONF", "")
        home = os.environ.get("HOME", "") if settings.workdir is None else ""
    parts = [*where, conf, home, settings.partition or "", settings.container, settings.workdir or ""]
    return "slurm-cluster/" + hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


async def fingerprint(transport: LocalTransport | SshTransport) -> str | None:
    """The hash of the ``slurm.conf`` Slurm's commands read through ``transport``; ``None`` when it cannot
    be read (configless, unreadable, the login node unreachable: then nothing is reused)."""
    try:
        shown = await transport.run(["sh", "-c", _CONF, "dispatch-conf"])
    except DispatchError as exc:
        _log.debug("cannot read slurm.conf: %s", exc)
        return None
    if not shown.ok or not shown.stdout:
        return None
    return hashlib.sha256(shown.stdout.encode()).hexdigest()


def encode(info: ClusterInfo) -> dict[str, Any]:
    """``info`` as a JSON object (what an entry keeps)."""
    facts = {name: getattr(info, name) for name in sorted(_FACTS)}
    facts["partitions"] = [dataclasses.asdict(p) for p in info.partitions]
    return facts


def decode(facts: Mapping[str, Any], kept_since: float) -> ClusterInfo | None:
    """The :class:`ClusterInfo` an entry keeps, or ``None`` when it is not whole (every field, each of
    its type)."""
    try:
        if set(facts) != _FACTS or not isinstance(facts["partitions"], list):
            return None
        partitions = tuple(Partition(**p) for p in facts["partitions"])
        info = ClusterInfo(**{**facts, "partitions": partitions, "kept_since": kept_since})
    except (TypeError, ValueError):
        return None
    return info if _typed(info) else None


def _typed(info: ClusterInfo) -> bool:
    kinds: dict[str, type | tuple[type, ...]] = {
        "version": str, "cluster_name": str, "controller": str, "accounting": bool, "jobcomp": bool,
        "preemption": bool, "container_plugin": bool, "workdir": str, "min_job_age": int,
    }  # fmt: skip
    if not all(isinstance(getattr(info, k), t) for k, t in kinds.items()):
        return False
    return all(
        isinstance(p.name, str)
        and isinstance(p.nodes, int)
        and isinstance(p.default, bool)
        and (p.max_nodes is None or isinstance(p.max_nodes, int))
        and isinstance(p.priority_tier, int)
        for p in info.partitions
    )


async def read_cached(
    settings: Settings, transport: LocalTransport | SshTransport, cache: ProbeCache | None, *, now: float
) -> ClusterInfo:
    """:func:`~dispatch_slurm.preflight.read_cluster`, from ``cache`` when an entry holds (see the module
    docstring), else read and kept."""
    if cache is None:
        return await read_cluster(settings, transport)
    key = cache_key(settings, transport)
    print_ = await fingerprint(transport)
    if print_ is not None:
        info = _reusable(await lookup(cache, key, format=FORMAT, ttl=TTL, now=now), print_)
        if info is not None and await _answers(transport):
            try:
                check_settings(settings, info.partitions)
            except DispatchError:
                pass  # refused from the cache? read Slurm's answer of now instead
            else:
                _log.info("opened from the cluster's facts kept since %.0f (%s)", info.kept_since or 0, key)
                return info
    info = await read_cluster(settings, transport)  # a refusal raises here: nothing is kept
    if print_ is not None:
        await keep(cache, key, {"fingerprint": print_, "facts": encode(info)}, format=FORMAT, now=now)
    return info


async def _answers(transport: LocalTransport | SshTransport) -> bool:
    """Whether slurmctld answers (``scontrol ping``: exit 0 and "is UP"). An open that keeps the facts
    still asks, so a controller or munge that is down fails the open as reading the facts would (the
    read that follows says why): a command that reads nothing else (the status of a job not yet
    submitted) must not show the cluster as reachable."""
    try:
        pinged = await transport.run(["scontrol", "ping"])
    except DispatchError:
        return False
    return pinged.ok and " is UP" in pinged.stdout


def _reusable(entry: Mapping[str, Any] | None, print_: str) -> ClusterInfo | None:
    """The facts of a fresh entry (:func:`~dispatch.probecache.lookup` checked its format and age) when
    it is of this ``slurm.conf`` and decodes whole."""
    if entry is None or entry.get("fingerprint") != print_:
        return None
    facts = entry.get("facts")
    return decode(facts, float(entry["at"])) if isinstance(facts, Mapping) else None
