"""Where a job stands for this process: its record refreshed from the cluster, or shown as last known (and
why) when the record is another cluster's or its dev cluster is gone; what a person could do next."""

from __future__ import annotations

from collections.abc import Mapping

import click

from dispatch.cli import devcluster
from dispatch.cli.embedded import OfflineBackend, gone_jobs, mark
from dispatch.cli.exits import EXIT_ALREADY_ENDED, EXIT_FAILED, EXIT_OK
from dispatch.cli.options import Options
from dispatch.cluster import Cluster
from dispatch.errors import ConflictError
from dispatch.model import JobRecord, State

__all__ = [
    "already_ended",
    "current_record",
    "exit_code",
    "last_known",
    "mark_dev",
    "next_steps",
    "refuse_gone",
    "refuse_gone_offline",
]


async def current_record(opts: Options, cluster: Cluster, job: str) -> tuple[JobRecord, str | None]:
    """The job's record refreshed from the cluster; as last known (and why) when its cluster is gone."""
    rec = await cluster.record(job)
    gone = await last_known(opts, cluster, [rec])
    if job in gone:
        return rec, gone[job]
    if isinstance(cluster.backend, OfflineBackend):
        return rec, None
    return await cluster.get(job), None


async def mark_dev(opts: Options, cluster: Cluster, job_id: str) -> None:
    """On the embedded default, remember which dev cluster instance runs the job."""
    if opts.cluster_file().embedded:
        dev = devcluster.running()
        if dev is not None:
            await mark(cluster, job_id, dev)


async def refuse_gone_offline(opts: Options, job: str) -> None:
    """Before a write command starts the dev cluster: refuse at once if the job's cluster is gone."""
    if not opts.cluster_file().embedded or devcluster.running() is not None:
        return
    async with opts.offline() as cluster:
        gone = await gone_jobs(cluster, [await cluster.record(job)], None)
    if job in gone:
        raise ConflictError(f"job {job!r}: {gone[job]}")


async def last_known(opts: Options, cluster: Cluster, records: list[JobRecord]) -> Mapping[str, str]:
    """Records this process shows as last known, never refreshing them (so never to ``lost``), with why:
    those of another cluster (only a process on a record's own cluster changes it, SPEC §6.1), and those
    of a dev cluster that is gone (which says more)."""
    out: dict[str, str] = {}
    if opts.cluster_file().embedded:
        out.update(
            {
                j: f"gone: {why}"
                for j, why in (await gone_jobs(cluster, records, devcluster.running())).items()
            }
        )
    for rec in records:
        if rec.job_id not in out and not rec.outcome.terminal and not await cluster.belongs(rec):
            out[rec.job_id] = f"{rec.cluster or 'another cluster'} (not this one)"
    return out


async def refuse_gone(opts: Options, cluster: Cluster, job: str, what: str) -> None:
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


def next_steps(rec: JobRecord) -> list[str]:
    """What a person could do next about a job that did not succeed (or is still on its way)."""
    jid = rec.job_id
    steps = []
    if rec.outcome.terminal:
        steps.append(f"`dispatch logs {jid}` (`--node N` for one node) shows what the nodes printed")
    steps.append(f"`dispatch describe {jid}` shows the job whole: spec, incarnations, evidence")
    steps.append(f"`dispatch history {jid}` lists every transition")
    if rec.outcome.terminal:
        steps.append(f"`dispatch resubmit {jid} [JOBFILE]` runs it again as a new incarnation")
    return steps
