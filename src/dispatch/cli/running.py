"""Submitting and running jobs: ``run`` (submit and supervise to the outcome), ``submit``, ``validate``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import click

from dispatch.cli import devcluster
from dispatch.cli.action import READ, WRITE, action
from dispatch.cli.config import ClusterFile
from dispatch.cli.exits import EXIT_OK
from dispatch.cli.following import follow, interrupted
from dispatch.cli.jobfile import load_adapter_extensions, load_spec, refused_job
from dispatch.cli.options import Options, settings_refused
from dispatch.cli.standing import mark_placed
from dispatch.cluster import Cluster
from dispatch.errors import ConflictError, DispatchError, InvalidError, UnsupportedError
from dispatch.model import JobRecord, JobSpec, Policy, State, new_job_id

if TYPE_CHECKING:
    from dispatch.fleet import Fleet

__all__ = ["COMMANDS"]


@click.command()
@click.argument("jobfile", type=click.Path(dir_okay=False))
@click.option("--job-id", metavar="ID", help="Job id (default: generated).")
@click.option(
    "--no-supervise",
    is_flag=True,
    help="Only follow the job: apply no recovery policy (a preempted job ends failed / preempted).",
)
@action(WRITE, spec="jobfile", fleet_clusters=True)
async def run(
    opts: Options,
    cluster: Cluster | Fleet,
    jobfile: str,
    spec: JobSpec,
    job_id: str | None,
    no_supervise: bool,
) -> int:
    """Submit JOBFILE and supervise it to its final outcome, printing every transition.

    The cluster's recovery policy applies: a job preempted, evicted or whose node was lost comes back as
    its next incarnation (see `dispatch history JOB`). Exit code 0 only when it succeeded."""
    # --no-supervise is recorded in the job: a policy that never requeues, so that no supervisor
    # (a `dispatch supervise` on the same store) overrides the choice later.
    policy = NEVER_REQUEUE if no_supervise else None
    rec = await _submit(opts, cluster, jobfile, spec, job_id=job_id, policy=policy)
    await mark_placed(opts, cluster, rec.job_id)
    try:
        return await follow(opts, cluster, rec, supervise=not no_supervise)
    except asyncio.CancelledError:  # Ctrl-C: the job is not ours to drop; say where it is
        where = " on the dev cluster" if opts.cluster_file().embedded else ""
        opts.say(await interrupted(opts, cluster, rec.job_id, where))
        raise


NEVER_REQUEUE = Policy()
"""``run --no-supervise``'s policy: no rule, and the default fails — every failure is final."""


async def _submit(
    opts: Options,
    cluster: Cluster | Fleet,
    jobfile: str,
    spec: JobSpec,
    *,
    job_id: str | None,
    held: bool = False,
    policy: Policy | None = None,
) -> JobRecord:
    """Submit; a start that failed after the record was written (the cluster unreachable, a webhook
    that does not answer) says what became of the record: kept pending, for a supervisor to start."""
    job_id = job_id if job_id is not None else new_job_id()
    try:
        with refused_job(jobfile):
            return await cluster.submit(
                spec, job_id=job_id, held=held, policy=policy, clusters=opts.fleet_clusters
            )
    except (InvalidError, UnsupportedError, ConflictError):
        raise  # refused before a record was written (a refused start ends it), or the id is another's
    except DispatchError as exc:
        try:
            rec = await cluster.record(job_id)
        except DispatchError:
            raise exc from None
        if rec.state is State.PENDING:
            exc.args = (
                f"{exc}; the record of {job_id} is kept, pending: a supervisor "
                f"(`{opts.again('supervise')}`) starts it once the cluster accepts it, and "
                f"`{opts.again('cancel', job_id)}` drops it",
            )
        raise


@click.command()
@click.argument("jobfile", type=click.Path(dir_okay=False))
@action(fleet_clusters=True)
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


CLUSTER_CHECKS = (
    "whether the cluster can run what the job names (a runtime that exists and obeys the adapter's rules), "
    "its limits (nodes, command, environment), and the config's settings (a queue that exists)"
)
"""What only the cluster can answer, and ``validate`` without one does not check."""


async def _ask_cluster(opts: Options, spec: JobSpec, jobfile: str) -> tuple[str | None, str | None]:
    """With a cluster config (or a running dev cluster), ask the cluster read-only whether it would
    accept the job: every check a submit makes (``prepare``), and the config's settings (a queue that
    does not exist, which a write command's open refuses), creating nothing. Else why it was not asked,
    naming the checks not made."""
    cf = opts.cluster_file()
    if cf.embedded and devcluster.running() is None:
        return None, (
            "no cluster config (--config, $DISPATCH_CONFIG) and the dev cluster is not running "
            f"(`dispatch dev-cluster start` starts it); not checked: {CLUSTER_CHECKS}"
        )
    cluster = await opts.open(read_only=True)
    if not isinstance(cluster, Cluster) or not isinstance(cf, ClusterFile):
        async with cluster:
            return await _ask_fleet(opts, cluster, spec, jobfile)
    async with cluster:
        with settings_refused(cf):
            # Read-only, the adapter notes what a write command's open refuses: the same refusal here.
            refused = [n for n in (await cluster.capabilities()).notes if n.startswith("settings.")]
            if refused:
                raise UnsupportedError(refused)
        with refused_job(jobfile):
            await cluster.dry_run(spec)
        for note in (await cluster.capabilities(spec)).notes:
            if note.startswith("warning:"):
                opts.say(note)
    return f"the {cf.adapter} cluster ({cf.source}) would accept it (asked read-only; nothing created)", None


async def _ask_fleet(
    opts: Options, fleet: Cluster | Fleet, spec: JobSpec, jobfile: str
) -> tuple[str | None, str | None]:
    """``validate`` in a fleet: where the job would be placed now (each allowed cluster asked whether it
    takes the spec, as a submit's placement asks), and every check of a submit on that one, creating
    nothing; refused when no cluster takes the spec, each one's reason said."""
    from msgspec.structs import replace

    from dispatch.placement import place

    assert not isinstance(fleet, Cluster)
    allowed = opts.fleet_clusters
    cf = opts.cluster_file()
    assert not isinstance(cf, ClusterFile)
    # Opened read-only to ask, each cluster says read-only: only those configured so refuse new jobs.
    candidates = [
        replace(c, refusing="read-only (readOnly: true in the config): it accepts no new jobs")
        if cf.member(c.name).read_only and not c.refusing
        else c
        for c in await fleet.placer.candidates(spec, "validate", 1, allowed, writing=False)
    ]
    got = place(candidates, allowed=allowed)
    if got.chosen is None:
        if all(c.refusing.startswith("does not take this job") for c in candidates):
            raise UnsupportedError([f"{jobfile}: {c.name} {c.refusing}" for c in candidates])
        return None, f"{got.why}; a submit waits for one of them"
    chosen = fleet.member(got.chosen.name).cluster
    assert chosen is not None
    with refused_job(jobfile):
        await chosen.dry_run(spec)
    return (
        f"the fleet ({cf.source}) would have it {got.why} (asked read-only; nothing created)",
        None,
    )


@click.command()
@click.argument("jobfile", type=click.Path(dir_okay=False))
@click.option("--held", is_flag=True, help="Create it held: it waits for `dispatch release`.")
@click.option("--dry-run", is_flag=True, help="Print the native object it would create; create nothing.")
@click.option("--job-id", metavar="ID", help="Job id (default: generated).")
# A dry run only reads, so the cluster is opened read-only: no probe, and no write can leave.
@action(lambda args: READ if args["dry_run"] else WRITE, spec="jobfile", fleet_clusters=True)
async def submit(
    opts: Options,
    cluster: Cluster | Fleet,
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
            request = await cluster.dry_run(spec, job_id=job_id, held=held)
        script = request.get("script")
        if out.output in ("text", "wide") and isinstance(script, str):
            out.text(script)  # a native request that is a script (Slurm's sbatch script): the script itself
        else:
            out.mapping(request)
        return EXIT_OK
    rec = await _submit(opts, cluster, jobfile, spec, job_id=job_id, held=held)
    await mark_placed(opts, cluster, rec.job_id)
    out.summary(rec, "submitted")
    return EXIT_OK


COMMANDS = (run, submit, validate)
