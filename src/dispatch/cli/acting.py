"""Acting on jobs: ``cancel``, ``hold``, ``release``, ``resubmit``; and on their records: ``forget``, ``purge``."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import click

from dispatch.cli import devcluster
from dispatch.cli.action import READ, WRITE, action, complete_job
from dispatch.cli.embedded import gone_jobs
from dispatch.cli.exits import EXIT_OK
from dispatch.cli.options import Options, parse_duration
from dispatch.cli.standing import already_ended, mark_placed, refuse_gone
from dispatch.cluster import Cluster
from dispatch.errors import InvalidError
from dispatch.model import JobSpec

if TYPE_CHECKING:
    from dispatch.fleet import Fleet

__all__ = ["COMMANDS"]


@click.command()
@click.argument("job", shell_complete=complete_job)
@click.option("--wait", is_flag=True, help="Then wait until the job has ended, and print how it ended.")
@action(WRITE, job="job")
async def cancel(opts: Options, cluster: Cluster | Fleet, job: str, wait: bool) -> int:
    """Cancel JOB: record the intent, stop its incarnation, and print where the job is now (``--wait``:
    then how it ended). A job that already ended is left as it is (exit code 3)."""
    await refuse_gone(opts, cluster, job, "cancel")
    before = await cluster.get(job)
    if before.outcome.terminal:
        return already_ended(opts, before, "cancel")
    rec = await cluster.cancel(job)
    out = opts.out
    if out.as_json or out.output == "name" or rec.outcome.terminal:
        out.summary(rec, "cancel:")
    else:  # what the cancel did: the stop is asked for; the job ends once its compute is gone
        out.line(
            f"cancel: {job}@{rec.epoch}: stop asked; the job is {rec.state.value} until its compute is gone"
        )
        if not wait:
            opts.say(
                f"`{opts.again('cancel', job, '--wait')}` or `{opts.again('watch', job)}` waits for its end"
            )
    if wait and not rec.outcome.terminal:
        async for rec in cluster.watch(job):  # noqa: B007 - the last record is how it ended
            pass
        out.summary(rec, "ended:")
    return EXIT_OK


@click.command()
@click.argument("jobs", nargs=-1, shell_complete=complete_job)
@click.option(
    "--cluster-gone",
    is_flag=True,
    help="Every unfinished job of a dev cluster that is gone (the embedded default's).",
)
@click.option("--reason", metavar="TEXT", help="Why, for the history (default: its cluster is gone).")
@action(READ)
async def forget(
    opts: Options, cluster: Cluster | Fleet, jobs: tuple[str, ...], cluster_gone: bool, reason: str | None
) -> int:
    """End JOBS, whose cluster is gone: each is recorded lost (the user as actor, the reason in its
    history) and never requeued. Nothing is asked of any cluster; a job of this cluster is refused
    (cancel it instead), a finished one is left as it is."""
    if not jobs and not cluster_gone:
        raise click.UsageError("name the jobs to forget, or --cluster-gone")
    todo = list(jobs)
    if cluster_gone:
        if not opts.cluster_file().embedded or not isinstance(cluster, Cluster):
            raise InvalidError(
                "only the embedded default's dev cluster is known to be gone when it stops; name the jobs "
                "of a cluster that no longer exists instead",
                path="--cluster-gone",
            )
        gone = await gone_jobs(cluster, await cluster.records(), devcluster.running())
        todo += sorted(j for j in gone if j not in todo)
    for job in todo:
        rec = await cluster.record(job)
        why = reason or f"its cluster {rec.cluster or '(unknown)'} is gone"
        after = await cluster.forget(job, why)
        if after.revision == rec.revision:
            opts.out.line(f"{job}@{rec.epoch}: already ended {rec.outcome}; left as it is")
        else:
            opts.out.summary(after, "forget")
    if not todo:
        opts.out.line("no job of a dev cluster that is gone")
    return EXIT_OK


@click.command()
@click.option(
    "--older-than",
    required=True,
    metavar="DURATION",
    help="Finished jobs last changed longer ago than this (30m, 24h, 168h).",
)
@action(READ)
async def purge(opts: Options, cluster: Cluster | Fleet, older_than: str) -> int:
    """Delete finished jobs' records (and their histories) last changed longer ago than --older-than.
    Unfinished jobs are never deleted; nothing is asked of any cluster."""

    seconds = parse_duration(older_than, "--older-than")
    count = await cluster.purge(time.time() - seconds)
    opts.out.line(f"purged {count} finished job(s) last changed more than {older_than} ago")
    return EXIT_OK


@click.command()
@click.argument("job", shell_complete=complete_job)
@action(WRITE, job="job")
async def hold(opts: Options, cluster: Cluster | Fleet, job: str) -> int:
    """Hold JOB (keep it from running) until released."""
    await refuse_gone(opts, cluster, job, "hold")
    opts.out.summary(await cluster.hold(job), "hold")
    return EXIT_OK


@click.command()
@click.argument("job", shell_complete=complete_job)
@action(WRITE, job="job")
async def release(opts: Options, cluster: Cluster | Fleet, job: str) -> int:
    """Release the hold on JOB."""
    await refuse_gone(opts, cluster, job, "release")
    opts.out.summary(await cluster.release(job), "release")
    return EXIT_OK


@click.command()
@click.argument("job", shell_complete=complete_job)
@click.argument("jobfile", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--wait",
    type=click.FloatRange(0, 86400),
    default=60.0,
    show_default=True,
    help="Seconds to wait for the previous incarnation's compute to go before giving up.",
)
@action(WRITE, job="job", spec="jobfile")
async def resubmit(
    opts: Options, cluster: Cluster | Fleet, job: str, jobfile: str | None, spec: JobSpec | None, wait: float
) -> int:
    """Start a new incarnation of finished JOB (with JOBFILE's spec, if given), once the previous
    incarnation's compute is gone."""
    await refuse_gone(opts, cluster, job, "resubmit")
    rec = await cluster.resubmit(job, spec, wait=wait)
    await mark_placed(opts, cluster, rec.job_id)
    opts.out.summary(rec, "resubmitted")
    return EXIT_OK


COMMANDS = (cancel, hold, release, resubmit, forget, purge)
