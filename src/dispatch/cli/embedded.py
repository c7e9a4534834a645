"""The CLI's embedded default (no config): jobs on the dev cluster, and records whose cluster is gone.

The dev cluster is a process (see :mod:`dispatch.cli.devcluster`); it can be stopped, or the machine
restarted, while records of jobs that ran on it remain in the store. Asking the cluster about such a job
would answer "no TrainJob", which reads as ``lost`` — but the job was not lost by a cluster that still
exists; the whole cluster is gone. So each job submitted on the dev cluster is marked (in the store's
key-value table) with the dev cluster instance it ran on, and a record whose instance no longer runs is
shown as it was last known, with ``cluster: gone`` and why; it is never folded to ``lost``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from dispatch.backend import Prepared
from dispatch.cli.devcluster import DevCluster
from dispatch.errors import ReadOnlyError, UnavailableError
from dispatch.model import Capabilities, Handle, Identity, JobRecord, JobSpec, Mode, Observation

if TYPE_CHECKING:
    from dispatch.cluster import Cluster

__all__ = ["OfflineBackend", "gone_jobs", "mark", "why_gone"]

_KEY = "devcluster/job/"


async def mark(cluster: Cluster, job_id: str, dev: DevCluster) -> None:
    """Remember that ``job_id``'s current incarnation runs on dev cluster instance ``dev``."""
    await cluster.set_note(_KEY + job_id, dev.instance)


def why_gone(dev: DevCluster | None) -> str:
    if dev is None:
        return "the dev cluster that ran it is not running (`dispatch dev-cluster start` starts a new, empty one)"
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(dev.started_at))
    return (
        f"the dev cluster that ran it was stopped; the one running now started at {started} and never had it"
    )


async def gone_jobs(
    cluster: Cluster, records: Iterable[JobRecord], dev: DevCluster | None
) -> Mapping[str, str]:
    """The job ids among ``records`` (not terminal) that ran on a dev cluster instance that no longer
    runs, with why. Records never marked (submitted with a config) are never gone."""
    out: dict[str, str] = {}
    for rec in records:
        if rec.outcome.terminal:
            continue
        instance = await cluster.note(_KEY + rec.job_id)
        if instance is not None and (dev is None or instance != dev.instance):
            out[rec.job_id] = why_gone(dev)
    return out


class OfflineBackend:
    """Stands in for the dev cluster when it is not running, so read commands still show the records
    (as last known). Every call that would need the cluster says that it is not running."""

    def __init__(self, adapter: str) -> None:
        self._adapter = adapter

    @property
    def name(self) -> str:
        return self._adapter

    @property
    def cluster_id(self) -> str:
        return ""  # no cluster: every record is shown as last known, none is this one's

    def _down(self, what: str) -> UnavailableError:
        return UnavailableError(
            f"{what}: the dev cluster is not running (`dispatch dev-cluster start` starts a new, empty one)"
        )

    async def capabilities(self, spec: JobSpec | None = None) -> Capabilities:
        return Capabilities(mode=Mode.READ_ONLY, notes=("the dev cluster is not running",))

    async def prepare(self, spec: JobSpec, identity: Identity, *, held: bool = False) -> Prepared:
        raise self._down(f"prepare {identity}")

    async def start(self, prepared: Prepared) -> Handle:
        raise ReadOnlyError("the dev cluster is not running")

    async def observe(self, handle: Handle) -> Observation:
        raise self._down(f"observe {handle}")

    async def stop(self, handle: Handle) -> None:
        raise ReadOnlyError("the dev cluster is not running")

    async def list(self) -> list[Observation]:
        raise self._down("list the cluster's jobs")

    async def close(self) -> None:
        return None
