"""Where a job stands for this process: its record refreshed from the cluster, or shown as last known (and
why) when the record is another cluster's or its dev cluster is gone; what a person could do next."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import click

from dispatch.cli import devcluster
from dispatch.cli.config import ClusterFile
from dispatch.cli.embedded import OfflineBackend, gone_jobs, mark
from dispatch.cli.exits import EXIT_ALREADY_ENDED, EXIT_FAILED, EXIT_OK
from dispatch.cli.options import Options
from dispatch.cluster import Cluster
from dispatch.errors import ConflictError
from dispatch.model import JobRecord, State, Transition, Unreachable

if TYPE_CHECKING:
    from dispatch.fleet import Fleet

__all__ = [
    "CLUSTER_NAME",
    "already_ended",
    "cluster_name",
    "cluster_names",
    "current_record",
    "down_of",
    "exit_code",
    "failing_node",
    "last_known",
    "mark_placed",
    "names_in",
    "next_steps",
    "refuse_gone",
    "refuse_gone_offline",
    "unreachable",
    "where_of",
]


async def current_record(opts: Options, cluster: Cluster | Fleet, job: str) -> tuple[JobRecord, str | None]:
    """The job's record refreshed from its cluster; as last known (and why) when its cluster is another,
    gone, or does not answer."""
    rec = await cluster.record(job)
    gone = await last_known(opts, cluster, [rec])
    if job in gone:
        return rec, gone[job]
    if isinstance(cluster, Cluster) and isinstance(cluster.backend, OfflineBackend):
        return rec, None
    rec = await cluster.get(job)
    down = down_of(cluster, rec)
    if down is not None and not rec.outcome.terminal:
        return rec, unreachable(down, where_of(cluster, rec))
    return rec, None


def down_of(cluster: Cluster | Fleet, record: JobRecord) -> Unreachable | None:
    """Since when, and why, the record's own cluster has not answered this process (``None``: it
    answers, or it is none of this process's clusters)."""
    return cluster.unreachable if isinstance(cluster, Cluster) else cluster.unreachable_of(record)


def where_of(cluster: Cluster | Fleet, record: JobRecord) -> str:
    """The record's cluster as a fleet names it ("" for a cluster opened alone: "the cluster")."""
    return "" if isinstance(cluster, Cluster) else cluster.name_of(record.cluster)


def unreachable(down: Unreachable, name: str = "") -> str:
    """Why a record is shown as last known while its cluster (``name``, in a fleet) does not answer
    (SPEC §5)."""
    import time

    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(down.at))
    return f"cluster {name + ' ' if name else ''}unreachable since {since} ({down.reason})"


async def mark_placed(opts: Options, cluster: Cluster | Fleet, job_id: str) -> None:
    """After a job was placed: on the embedded default, remember which dev cluster instance runs it; and
    what people call its cluster (:func:`cluster_name`), for the page to show instead of an identity. (A
    fleet names its clusters itself.)"""
    if not isinstance(cluster, Cluster):
        return
    if opts.cluster_file().embedded:
        dev = devcluster.running()
        if dev is not None:
            await mark(cluster, job_id, dev)
    key, name = CLUSTER_NAME + cluster.cluster_id, cluster_name(opts)
    if cluster.cluster_id and await cluster.note(key) != name:
        await cluster.set_note(key, name)


CLUSTER_NAME = "cluster/name/"
"""The store's notes naming clusters: ``cluster/name/<cluster identity>`` → the name people know it by."""


def cluster_name(opts: Options) -> str:
    """What people call the opened cluster: its name in a config naming several, else the kubeconfig
    context chosen, else "dev cluster" (the embedded default), else the config file's name."""
    from pathlib import Path

    cf = opts.cluster_file()
    if not isinstance(cf, ClusterFile):
        return Path(cf.source).stem
    context = cf.settings.get("context")
    if cf.cluster:
        return cf.cluster
    if isinstance(context, str) and context:
        return context
    return "dev cluster" if cf.embedded else Path(cf.source).stem


async def cluster_names(opts: Options, cluster: Cluster | Fleet, clusters: Sequence[str]) -> dict[str, str]:
    """The names of ``clusters`` (identities) that have one: a fleet's names for its own, the opened
    cluster's, and those kept in the store's notes by the commands that placed jobs there."""
    here = ""
    if isinstance(cluster, Cluster) and not isinstance(cluster.backend, OfflineBackend):
        here = cluster.cluster_id
    out: dict[str, str] = {}
    for ident in clusters:
        if not isinstance(cluster, Cluster) and cluster.name_of(ident) != ident:
            name: str | None = cluster.name_of(ident)
        elif ident == here:
            name = cluster_name(opts)
        else:
            name = await cluster.note(CLUSTER_NAME + ident)
        if name:
            out[ident] = name
    return out


async def names_in(
    opts: Options, cluster: Cluster | Fleet, records: Sequence[JobRecord], history: Sequence[Transition] = ()
) -> dict[str, str] | None:
    """In a fleet, the names of the clusters ``records`` and ``history`` name, for the commands to show
    them (``None`` for a cluster opened alone: its output says no more than it did)."""
    if isinstance(cluster, Cluster):
        return None
    idents = {r.cluster for r in records} | {t.cluster for t in history}
    return await cluster_names(opts, cluster, sorted(i for i in idents if i))


async def refuse_gone_offline(opts: Options, job: str) -> None:
    """Before a write command starts the dev cluster: refuse at once if the job's cluster is gone."""
    if not opts.cluster_file().embedded or devcluster.running() is not None:
        return
    async with opts.offline() as cluster:
        gone = await gone_jobs(cluster, [await cluster.record(job)], None)
    if job in gone:
        raise ConflictError(f"job {job!r}: {gone[job]}")


async def last_known(opts: Options, cluster: Cluster | Fleet, records: list[JobRecord]) -> Mapping[str, str]:
    """Records this process shows as last known, never refreshing them (so never to ``lost``), with why:
    those of another cluster (only a process on a record's own cluster changes it, SPEC §6.1), those of
    a cluster of the fleet that cannot be opened now, and those of a dev cluster that is gone (which says
    more)."""
    out: dict[str, str] = {}
    if opts.cluster_file().embedded and isinstance(cluster, Cluster):
        out.update(
            {
                j: f"gone: {why}"
                for j, why in (await gone_jobs(cluster, records, devcluster.running())).items()
            }
        )
    for rec in records:
        if rec.job_id in out or rec.outcome.terminal or await cluster.belongs(rec):
            continue
        down = down_of(cluster, rec)
        if down is not None:
            out[rec.job_id] = unreachable(down, where_of(cluster, rec))
        elif isinstance(cluster, Cluster):
            out[rec.job_id] = f"{rec.cluster or 'another cluster'} (not this one)"
        else:
            out[rec.job_id] = f"{rec.cluster or 'another cluster'} (not one of this fleet's clusters)"
    return out


async def refuse_gone(opts: Options, cluster: Cluster | Fleet, job: str, what: str) -> None:
    gone = await last_known(opts, cluster, [await cluster.record(job)])
    if job in gone:
        raise ConflictError(f"cannot {what} job {job!r}: {gone[job]}")


def already_ended(opts: Options, rec: JobRecord, what: str) -> int:
    """A write that has nothing to act on: the job already ended. Said on stderr, with its outcome."""
    click.echo(f"error: cannot {what} {rec.job_id}@{rec.epoch}: it already ended {rec.outcome}", err=True)
    if opts.as_json:
        opts.out.json({"error": {"type": "AlreadyEnded", "message": f"already ended {rec.outcome}"}})
    return EXIT_ALREADY_ENDED


def exit_code(rec: JobRecord) -> int:
    """The exit code of a job's outcome: 0 only for ``succeeded``; 1 for every other end."""
    return EXIT_OK if rec.state is State.SUCCEEDED else EXIT_FAILED


def next_steps(opts: Options, rec: JobRecord) -> list[str]:
    """What a person could do next about a job that did not succeed (or is still on its way), as command
    lines that reach the same cluster as this one (``--config`` and friends, :meth:`Options.again`)."""
    jid = rec.job_id
    steps = []
    failing = failing_node(rec)
    if rec.outcome.terminal and failing is not None:
        steps.append(
            f"`{opts.again('logs', jid, '--node', str(failing))}` shows what node {failing}, which failed, printed"
        )
    elif rec.outcome.terminal:
        steps.append(f"`{opts.again('logs', jid)}` (`--node N` for one node) shows what the nodes printed")
    steps.append(f"`{opts.again('describe', jid)}` shows the job whole: spec, incarnations, evidence")
    steps.append(f"`{opts.again('history', jid)}` lists every transition")
    if rec.outcome.terminal:
        steps.append(f"`{opts.again('resubmit', jid, '[JOBFILE]')}` runs it again as a new incarnation")
    return steps


def failing_node(rec: JobRecord) -> int | None:
    """The node (index) a failure's evidence is about, when the adapter says (``Evidence.rank``) and the
    job has more than one."""
    return rec.outcome.failed_rank if rec.spec.nodes > 1 else None
