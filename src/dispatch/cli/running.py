"""Submitting and running jobs: ``run`` (submit and supervise to the outcome), ``submit``, ``validate``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import click

from dispatch import decide
from dispatch.cli import devcluster
from dispatch.cli.action import READ, WRITE, action
from dispatch.cli.exits import EXIT_OK
from dispatch.cli.jobfile import load_adapter_extensions, load_spec, refused_job
from dispatch.cli.options import Options
from dispatch.cli.standing import exit_code, mark_dev, next_steps
from dispatch.cluster import Cluster
from dispatch.errors import DispatchError, UnsupportedError
from dispatch.model import JobRecord, JobSpec, State

__all__ = ["COMMANDS"]


@click.command()
@click.argument("jobfile", type=click.Path(dir_okay=False))
@click.option("--job-id", metavar="ID", help="Job id (default: generated).")
@click.option(
    "--no-supervise",
    is_flag=True,
    help="Only follow the job: apply no recovery policy (a preempted job ends failed / preempted).",
)
@action(WRITE, spec="jobfile")
async def run(
    opts: Options, cluster: Cluster, jobfile: str, spec: JobSpec, job_id: str | None, no_supervise: bool
) -> int:
    """Submit JOBFILE and supervise it to its final outcome, printing every transition.

    The cluster's recovery policy applies: a job preempted, evicted or whose node was lost comes back as
    its next incarnation (see `dispatch history JOB`). Exit code 0 only when it succeeded."""
    with refused_job(jobfile):
        rec = await cluster.submit(spec, job_id=job_id)
    await mark_dev(opts, cluster, rec.job_id)
    try:
        return await _follow(opts, cluster, rec, supervise=not no_supervise)
    except asyncio.CancelledError:  # Ctrl-C: the job is not ours to drop; say where it is
        where = " on the dev cluster" if opts.cluster_file().embedded else ""
        opts.say(await _interrupted(cluster, rec.job_id, where))
        raise


async def _interrupted(cluster: Cluster, job_id: str, where: str) -> str:
    """What Ctrl-C during ``run`` leaves behind, in words: a job waiting to be (re)started (a requeue's
    backoff) has nothing to start it until a supervisor runs, and that must be said."""
    try:
        rec = await asyncio.shield(cluster.record(job_id))
    except (DispatchError, asyncio.CancelledError):
        rec = None
    if rec is not None and rec.state is State.PENDING:
        return (
            f"interrupted: job {job_id} is pending ({rec.epoch}){where}: nothing starts it until a supervisor "
            f"runs — `dispatch supervise` will start it and apply the recovery policy; "
            f"`dispatch cancel {job_id}` cancels it"
        )
    return (
        f"interrupted: job {job_id} keeps running{where}, unsupervised; "
        f"`dispatch status {job_id}` follows it, `dispatch supervise` applies the recovery "
        f"policy, `dispatch cancel {job_id}` cancels it"
    )


async def _follow(opts: Options, cluster: Cluster, rec: JobRecord, *, supervise: bool) -> int:
    """Supervise (or, without ``supervise``, only follow) the job to its final outcome, printing every
    transition; the exit code of the outcome.

    On a terminal a live line shows the job's state, cause and elapsed time, redrawn every second."""
    out = opts.out
    jid = rec.job_id
    printed = 0
    started = time.monotonic()
    latest = rec
    with out.progress(_live_line(rec, started)) as status:
        ticker = asyncio.create_task(_tick(status, lambda: _live_line(latest, started))) if status else None

        async def show() -> JobRecord:
            nonlocal printed, latest
            current = await cluster.record(jid)
            history = await cluster.history(jid)
            for t in history[printed:]:
                out.transition(jid, t)
            printed = len(history)
            latest = current
            if status is not None:
                status.update(_live_line(current, started))
            return current

        try:
            if supervise:
                # This job only: another supervisor (`dispatch supervise`) holding its lease finishes it
                # instead, and this command follows the record until the outcome is final.
                sup = cluster.supervisor(jobs={jid}, poll=RUN_POLL, lease=RUN_LEASE)

                async def final() -> bool:
                    return decide.final(await show(), sup.policy, cluster.clock.now())

                await sup.run(until=final)
                rec = await show()
            else:
                async for rec in cluster.watch(jid):  # noqa: B007 - the last record is the outcome
                    await show()
        finally:
            if ticker is not None:
                ticker.cancel()
    out.outcome(rec)
    if rec.state is not State.SUCCEEDED and not out.as_json:
        for hint in next_steps(rec):
            opts.say(f"next: {hint}")
    return exit_code(rec)


def _live_line(rec: JobRecord, started: float) -> str:
    cause = "" if rec.outcome.cause.value == "none" else f" ({rec.outcome.cause.value})"
    return f"{rec.job_id}@{rec.epoch}: {rec.state.value}{cause}  {time.monotonic() - started:.0f}s"


async def _tick(status: Any, text: Callable[[], str]) -> None:
    while True:
        await asyncio.sleep(1.0)
        status.update(text())


RUN_POLL = 0.5
RUN_LEASE = 15.0
"""``dispatch run``'s supervisor: poll interval and lease (seconds)."""


@click.command()
@click.argument("jobfile", type=click.Path(dir_okay=False))
@action()
async def validate(opts: Options, jobfile: str) -> int:
    """Check JOBFILE strictly; with a cluster config (or a running dev cluster), also ask the cluster,
    read-only, whether it would accept the job."""
    spec = load_spec(jobfile)
    if spec.extensions.opaque():
        load_adapter_extensions()
        spec = load_spec(jobfile)
    opaque = spec.extensions.opaque()
    if opaque:
        raise UnsupportedError(
            [f"{jobfile}: extension {name!r} is not known to any installed adapter" for name in opaque]
        )
    asked, why_not = await _ask_cluster(opts, spec, jobfile)
    out = opts.out
    if out.as_json:
        out.json({"valid": True, "spec": spec.to_json(), "cluster": asked, "clusterNotAsked": why_not})
    else:
        exts = ", ".join(spec.extensions) or "none"
        out.line(f"ok: {jobfile}: {spec.nodes} node(s), command {list(spec.command)}, extensions: {exts}")
        out.line(f"ok: {asked}" if asked else f"note: the cluster was not asked: {why_not}")
    return EXIT_OK


async def _ask_cluster(opts: Options, spec: JobSpec, jobfile: str) -> tuple[str | None, str | None]:
    """With a cluster config (or a running dev cluster), ask the cluster read-only whether it would
    accept the job: every check a submit makes (``prepare``), creating nothing. Else why it was not."""
    cf = opts.cluster_file()
    if cf.embedded and devcluster.running() is None:
        return None, (
            "no cluster config (--config, $DISPATCH_CONFIG) and the dev cluster is not running "
            "(`dispatch dev-cluster start` starts it)"
        )
    cluster = await opts.open(read_only=True)
    async with cluster:
        with refused_job(jobfile):
            await cluster.dry_run(spec)
        for note in (await cluster.capabilities(spec)).notes:
            if note.startswith("warning:"):
                opts.say(note)
    return f"the {cf.adapter} cluster ({cf.source}) would accept it (asked read-only; nothing created)", None


@click.command()
@click.argument("jobfile", type=click.Path(dir_okay=False))
@click.option("--held", is_flag=True, help="Create it held: it waits for `dispatch release`.")
@click.option("--dry-run", is_flag=True, help="Print the native object it would create; create nothing.")
@click.option("--job-id", metavar="ID", help="Job id (default: generated).")
# A dry run only reads, so the cluster is opened read-only: no probe, and no write can leave.
@action(lambda args: READ if args["dry_run"] else WRITE, spec="jobfile")
async def submit(
    opts: Options,
    cluster: Cluster,
    jobfile: str,
    spec: JobSpec,
    held: bool,
    dry_run: bool,
    job_id: str | None,
) -> int:
    """Submit JOBFILE and print its record (do not wait)."""
    out = opts.out
    if dry_run:
        with refused_job(jobfile):
            out.mapping(await cluster.dry_run(spec, job_id=job_id, held=held))
        return EXIT_OK
    with refused_job(jobfile):
        rec = await cluster.submit(spec, job_id=job_id, held=held)
    await mark_dev(opts, cluster, rec.job_id)
    out.summary(rec, "submitted")
    return EXIT_OK


COMMANDS = (run, submit, validate)
