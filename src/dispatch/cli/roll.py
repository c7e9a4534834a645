"""What ``dispatch clusters`` says of each configured cluster: :class:`Row` and :func:`roll`.

A fleet's clusters each (or those ``--cluster`` names), else the one cluster configured: its name, adapter
and identity; whether it answers — a listing of its jobs, since what an adapter knows of its cluster it may
say without asking — and since when and why not; a summary of its capabilities; the checkpoint directory
its jobs see; how many of the store's records are on it (its current incarnations), and how many of those
have not ended.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dispatch.cli.config import ClusterFile
from dispatch.cli.options import Options
from dispatch.cli.render import rfc3339, when
from dispatch.cli.standing import cluster_name
from dispatch.cluster import Cluster
from dispatch.errors import DispatchError
from dispatch.model import Capabilities, JobRecord, Unreachable

if TYPE_CHECKING:
    from dispatch.fleet import Fleet

__all__ = ["ANSWER", "Row", "roll"]

ANSWER = 10.0
"""Seconds a cluster (alone, not in a fleet) is given to answer the listing that says it answers."""


@dataclass(frozen=True, slots=True)
class Row:
    """One cluster as ``dispatch clusters`` shows it (see the module docstring)."""

    name: str
    adapter: str
    identity: str
    capabilities: Capabilities | None
    down: Unreachable | None
    checkpoints: str
    jobs: int
    unfinished: int

    def cells(self) -> list[str]:
        """The table's cells."""
        down = self.down
        reachable = "yes" if down is None else f"no, since {when(down.at)} ({down.reason})"
        return [
            self.name,
            self.adapter,
            self.identity or "(not known yet)",
            reachable,
            self.checkpoints or "-",
            f"{self.jobs} ({self.unfinished} unfinished)",
            summary(self.capabilities) if self.capabilities is not None else "-",
        ]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "adapter": self.adapter,
            "identity": self.identity,
            "reachable": self.down is None,
            "checkpoints": self.checkpoints,
            "jobs": self.jobs,
            "unfinished": self.unfinished,
        }
        if self.down is not None:
            out["unreachable"] = {"since": rfc3339(self.down.at), "reason": self.down.reason}
        if self.capabilities is not None:
            out["capabilities"] = self.capabilities.to_json()
        return out


def summary(caps: Capabilities) -> str:
    """A cluster's capabilities in a few words: its size, what it can do, its extensions. (Not its mode:
    ``dispatch clusters`` opens every cluster read-only, so each says read-only; its config says more.)"""
    can = [k for k, on in (("holds", caps.holds), ("watch", caps.watch), ("output", caps.output)) if on]
    can += ["shared checkpoints"] if caps.shared_checkpoint else []
    limits = (
        f"up to {caps.limits.max_nodes} nodes" if caps.limits.max_nodes is not None else "nodes: no limit"
    )
    parts = [limits, ", ".join(can) or "no holds, watch or output"]
    if caps.extensions:
        parts.append(", ".join(sorted(caps.extensions)))
    return "; ".join(parts)


async def roll(opts: Options, cluster: Cluster | Fleet) -> list[Row]:
    """The rows of ``dispatch clusters`` for the configured cluster or fleet."""
    records = list(await cluster.records())
    if isinstance(cluster, Cluster):
        return [await _alone(opts, cluster, records)]
    cf = opts.cluster_file()
    assert not isinstance(cf, ClusterFile)
    got = await cluster.capabilities()
    rows = []
    for m in cluster.members:
        if opts.fleet_clusters and m.name not in opts.fleet_clusters:
            continue
        caps = got[m.name]
        on = [r for r in records if m.seat.identity and r.cluster == m.seat.identity]
        rows.append(
            Row(
                m.name,
                cf.member(m.name).adapter,
                m.seat.identity,
                caps if isinstance(caps, Capabilities) else None,
                caps if isinstance(caps, Unreachable) else None,
                m.seat.checkpoints,
                len(on),
                sum(1 for r in on if not r.outcome.terminal),
            )
        )
    return rows


async def _alone(opts: Options, cluster: Cluster, records: list[JobRecord]) -> Row:
    """The one cluster of a config that is not a fleet."""
    cf = opts.cluster_file()
    assert isinstance(cf, ClusterFile)
    caps: Capabilities | None = None
    down: Unreachable | None = None
    try:
        async with asyncio.timeout(ANSWER):
            caps = await cluster.capabilities()
            await cluster.backend.list()
    except TimeoutError:
        down = Unreachable(at=time.time(), reason=f"it did not answer within {ANSWER:g} s")
    except DispatchError as exc:
        down = Unreachable(at=time.time(), reason=f"{type(exc).__name__}: {exc}")
    here = cluster.cluster_id
    on = [r for r in records if here and r.cluster == here]
    return Row(
        cluster_name(opts),
        cf.adapter,
        here,
        caps if down is None else None,
        down,
        "",
        len(on),
        sum(1 for r in on if not r.outcome.terminal),
    )
