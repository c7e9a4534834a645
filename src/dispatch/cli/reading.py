"""Reading jobs (read-only: no probe, no write): ``status``, ``list``, ``watch``, ``history``, ``describe``,
``logs``."""

from __future__ import annotations

import asyncio

import click

from dispatch.cli.action import READ, action, complete_job, quiet_pipe, report_error
from dispatch.cli.embedded import OfflineBackend
from dispatch.cli.exits import EXIT_FAILED, EXIT_OK
from dispatch.cli.options import Options, parse_duration
from dispatch.cli.standing import current_record, exit_code, last_known, next_steps, unreachable
from dispatch.cluster import Cluster
from dispatch.errors import (
    BusyError,
    ConflictError,
    DispatchError,
    InvalidError,
    NotFoundError,
    UnsupportedError,
)
from dispatch.model import JobRecord, State

__all__ = ["COMMANDS"]


@click.command()
@click.argument("job", shell_complete=complete_job)
@action(READ)
async def status(opts: Options, cluster: Cluster, job: str) -> int:
    """Show the record of JOB, refreshed from the cluster (read-only: no probe, no write)."""
    rec, gone = await current_record(opts, cluster, job)
    opts.out.record(rec, gone=gone)
    return EXIT_OK


@click.command("list")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([s.value for s in State]),
    help="Only jobs in this state (repeatable).",
)
@click.option(
    "-l",
    "--selector",
    metavar="SELECTOR",
    help="Only jobs matching it: key=value,key!=value over state, cause, epoch, adapter, env.NAME.",
)
@click.option("-w", "--watch", "keep_watching", is_flag=True, help="After the list, a line per change.")
@action(READ)
async def list_(
    opts: Options, cluster: Cluster, states: tuple[str, ...], selector: str | None, keep_watching: bool
) -> int:
    """List every job, refreshed from the cluster (read-only: no probe, no write).

    With -n/--namespace only the jobs placed in that namespace; with --context the cluster is opened
    first, so a context the kubeconfig does not have is refused, naming those it has."""
    from dispatch.cli.selectors import matches, namespace_of, parse_selector

    wanted = [State(s) for s in states] or None
    requirements = parse_selector(selector) if selector else []
    if opts.context is not None:  # the records alone would answer: the context would never be read
        await cluster.capabilities()
    stored = await cluster.records()
    mine = list(stored)
    if opts.namespace is not None:  # only those: another namespace's jobs are not this backend's to read
        mine = [r for r in stored if namespace_of(r) == opts.namespace]
        if not mine:
            elsewhere = sorted({ns for r in stored if (ns := namespace_of(r)) is not None})
            others = f"; namespaces with jobs: {', '.join(elsewhere)}" if elsewhere else ""
            opts.say(f"no job in namespace {opts.namespace}{others}")
    gone = await last_known(opts, cluster, mine)
    if isinstance(cluster.backend, OfflineBackend):  # no cluster to ask: the records as last known
        records = [r for r in mine if wanted is None or r.state in wanted]
    elif not gone and opts.namespace is None:
        records = await cluster.list(wanted)
    else:  # refresh the others one by one; the gone ones stay as last known
        records = [r if r.job_id in gone or r.outcome.terminal else await cluster.get(r.job_id) for r in mine]
        records = [r for r in records if wanted is None or r.state in wanted]
    records = [r for r in records if matches(r, requirements)]
    if cluster.unreachable is not None:  # none refreshed: each unfinished one as last known, and why
        gone = {**{r.job_id: unreachable(cluster) for r in records if not r.outcome.terminal}, **gone}
        click.echo(f"note: {unreachable(cluster)}: unfinished jobs are shown as last known", err=True)
    out = opts.out
    out.records(records, gone=gone)
    for bad in stored.unreadable:  # one line each, on stderr: the others are listed
        click.echo(f"skipped: {bad}", err=True)
    if not keep_watching:
        return EXIT_OK
    shown = {r.job_id: r.revision for r in records}
    out.no_headers = True  # as kubectl's --watch: the rows that change, under the first table
    async for rec in cluster.watch():
        if shown.get(rec.job_id) == rec.revision:
            continue  # the watch begins with what the list just showed
        shown[rec.job_id] = rec.revision
        if (
            (wanted is None or rec.state in wanted)
            and matches(rec, requirements)
            and opts.namespace in (None, namespace_of(rec))
        ):
            out.records([rec], gone=gone)
    return EXIT_OK


@click.command()
@click.argument("job", required=False, shell_complete=complete_job)
@action(READ)
async def watch(opts: Options, cluster: Cluster, job: str | None) -> int:
    """Print records as they change: one job until it ends, or every job until interrupted.

    With JOB the exit code is its outcome's: 0 only when it succeeded."""
    out = opts.out
    if job is not None:
        rec, gone = await current_record(opts, cluster, job)
        if gone:  # nothing will change any more: say so rather than wait, or call it lost
            out.record(rec, gone=gone)
            return EXIT_FAILED
    last: JobRecord | None = None
    with out.live_jobs() as live:  # a line per job on a terminal; one line per change otherwise
        async for last in cluster.watch(job):
            if live is not None:
                live.update(last)
            else:
                out.summary(last)
    return exit_code(last) if job is not None and last is not None else EXIT_OK


@click.command()
@click.argument("job", shell_complete=complete_job)
@action(READ)
async def history(opts: Options, cluster: Cluster, job: str) -> int:
    """Show the transitions of JOB, oldest first, then every incarnation and why it ended.

    The record is refreshed first (read-only), so the last lines say where the job is now."""
    await current_record(opts, cluster, job)
    opts.out.transitions(job, await cluster.history(job), incarnations=True)
    return EXIT_OK


@click.command("describe")
@click.argument("job", shell_complete=complete_job)
@action(READ)
async def describe_(opts: Options, cluster: Cluster, job: str) -> int:
    """Show JOB whole: its record and spec, every incarnation as a timeline (states, causes, evidence,
    the rule of each requeue), its cluster objects, and the next steps a person could take."""
    rec, gone = await current_record(opts, cluster, job)
    steps = [s for s in next_steps(opts, rec) if " describe " not in s]
    opts.out.describe(rec, await cluster.history(job), steps, gone=gone)
    return EXIT_OK


@click.command()
@click.argument("job", shell_complete=complete_job)
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the nodes' output ends.")
@click.option(
    "--node",
    type=click.IntRange(min=0),
    help="Only this node (index); default: every node, each line prefixed.",
)
@click.option("--tail", type=click.IntRange(min=0), help="Only the last N lines (of each node).")
@click.option(
    "--previous", "-p", is_flag=True, help="The node's last terminated run (a node that restarted in place)."
)
@click.option(
    "--epoch",
    "epoch_text",
    metavar="EPOCH",
    help="Incarnation N, as shown (N.R, e.g. 2.1) or its number N (default: the current one).",
)
@click.option(
    "--since", metavar="DURATION", help="Only lines of the last DURATION (kubectl's: 30s, 5m, 1h30m)."
)
@click.option("--timestamps", is_flag=True, help="Each line starts with the RFC 3339 time it was written.")
@action(READ)
async def logs(
    opts: Options,
    cluster: Cluster,
    job: str,
    follow: bool,
    node: int | None,
    tail: int | None,
    previous: bool,
    epoch_text: str | None,
    since: str | None,
    timestamps: bool,
) -> int:
    """Print the output of JOB's nodes: every node at once, each line prefixed with its node, or one.

    What can be read is printed; a node whose output cannot be read is named on stderr (exit code 1)."""
    seconds = parse_duration(since, "--since") if since is not None else None
    epoch = parse_epoch(epoch_text) if epoch_text is not None else None
    rec, gone = await current_record(opts, cluster, job)
    if gone:
        raise ConflictError(f"cannot read the output of {job}: {gone}")
    if not await cluster.belongs(rec):
        raise ConflictError(other_cluster(opts, cluster, rec))
    nodes = rec.spec.nodes
    if node is not None and node >= nodes:
        raise InvalidError(
            f"node {node} does not exist: {job} has {nodes} node(s), 0 to {nodes - 1}", path="--node"
        )
    if epoch is not None:
        check_epoch(opts, rec, *epoch)
    why = nothing_yet(opts, rec, follow=follow)
    if why is not None:
        opts.say(why)
        if not follow or rec.state is State.HELD:
            return EXIT_OK
    out = opts.out
    chosen = [node] if node is not None else list(range(nodes))
    prefix = node is None and nodes > 1
    unread: dict[int, DispatchError] = {}

    readers: list[asyncio.Task[None]] = []
    reader_gone = False

    def show(n: int, line: str) -> None:
        nonlocal reader_gone
        try:
            if out.as_json:
                out.json({"jobId": job, "node": n, "line": line})
            else:
                out.line(f"[node {n}] {line}" if prefix else line)
        except BrokenPipeError:
            # The reader went away (`| grep -m1`). Each node's reading is cancelled at its next wait, deep
            # in the stream, so every level of it closes in order; raised from here instead, the streams
            # were left to the loop's shutdown, which closed them twice at once (a traceback).
            if not reader_gone:
                reader_gone = True
                quiet_pipe()
                for task in readers:
                    task.cancel()

    async def read(n: int) -> None:
        try:
            lines = cluster.output(
                job, node=n, follow=follow, tail=tail, previous=previous, since=seconds, timestamps=timestamps
            )
            async for line in lines:
                show(n, line)
        except (InvalidError, UnsupportedError):
            raise  # the same for every node: the command's error
        except BusyError as exc:
            # --previous: not "retry later", there is no earlier run to wait for
            unread[n] = (
                NotFoundError(
                    f"node {n} of {job}@{rec.epoch} has no earlier run: it has not restarted in place"
                )
                if previous
                else exc
            )
        except DispatchError as exc:  # this node's output cannot be read: the others' still can
            unread[n] = exc

    if follow and len(chosen) > 1:  # every node's lines as they come
        try:
            async with asyncio.TaskGroup() as group:
                readers.extend(group.create_task(read(n)) for n in chosen)
        except BaseExceptionGroup as group_error:  # an error that is every node's (unsupported): one line
            raise group_error.exceptions[0] from None
    else:
        for n in chosen:
            task = asyncio.create_task(read(n))
            readers[:] = [task]
            try:
                await asyncio.wait([task])
            except asyncio.CancelledError:  # the command itself is cancelled (Ctrl-C)
                task.cancel()
                raise
            if reader_gone:
                break
            task.result()  # its error is the command's
    if reader_gone:
        raise BrokenPipeError
    if len(unread) == len(chosen) == 1:
        raise unread[chosen[0]]
    for n, exc in sorted(unread.items()):
        said = str(exc) if f"node {n} " in str(exc) else f"node {n}: {exc}"
        report_error(opts, exc, message=said, jobId=job, node=n)
    if unread:
        opts.say(
            f"{job}@{rec.epoch}: read {len(chosen) - len(unread)} of {len(chosen)} node(s); "
            f"node(s) {', '.join(str(n) for n in sorted(unread))} could not be read (above)"
        )
        return EXIT_FAILED
    return EXIT_OK


def parse_epoch(text: str) -> tuple[int, int | None]:
    """``--epoch``: an incarnation as every command shows it, ``N.R`` (``1.0``, ``2.1``), or its number
    ``N``; the number, and the requeue count when given."""
    import re

    m = re.fullmatch(r"(\d{1,7})(?:\.(\d{1,7}))?", text.strip())
    if m is None or int(m.group(1)) < 1:
        raise InvalidError(
            f"{text!r}: expected an incarnation as shown, N.R (1.0, 2.1), or its number N (1, 2)",
            path="--epoch",
        )
    return int(m.group(1)), int(m.group(2)) if m.group(2) is not None else None


def check_epoch(opts: Options, rec: JobRecord, n: int, r: int | None) -> None:
    """Only the current incarnation's output can be read: say why another's cannot."""
    if n != rec.epoch.n:
        raise NotFoundError(earlier_output(opts, rec, n))
    if r is not None and r != rec.epoch.r:
        raise NotFoundError(f"{rec.job_id} has no epoch {n}.{r}: its incarnation {n} is {rec.epoch}")


def other_cluster(opts: Options, cluster: Cluster, rec: JobRecord) -> str:
    """Why the output of a record of another cluster (or adapter) cannot be read here: only its own
    cluster has it (SPEC §6.1). The record is shown as last known, as everywhere else."""
    theirs = rec.cluster or (
        f"a {rec.handle.backend} cluster" if rec.handle is not None else "another cluster"
    )
    here = cluster.cluster_id or "none: the dev cluster is not running"
    return (
        f"cannot read the output of {rec.job_id}: it ran on {theirs}, not on this cluster ({here}), and only "
        f"its own cluster has its nodes' output (`dispatch --config ITS-CONFIG logs {rec.job_id}` reads it); "
        f"shown as last known: {rec.job_id}@{rec.epoch} {rec.outcome}, its evidence in "
        f"`{opts.again('describe', rec.job_id)}`"
    )


def nothing_yet(opts: Options, rec: JobRecord, *, follow: bool) -> str | None:
    """Why a job has no output to read yet, or ``None`` when it may have some."""
    jid = f"{rec.job_id}@{rec.epoch}"
    if rec.state is State.HELD:
        return f"{jid} is held: its nodes do not run until `{opts.again('release', rec.job_id)}`; nothing to read"
    if rec.state is State.PENDING:
        then = "waiting for them to start" if follow else "`--follow` waits for them to start"
        return f"{jid} is pending (its nodes have not started): nothing to read yet; {then}"
    return None


def earlier_output(opts: Options, rec: JobRecord, n: int) -> str:
    """Why the output of incarnation ``n`` (not the current one) cannot be read."""
    if n > rec.epoch.n:
        return f"{rec.job_id} has no incarnation {n}: the current one is {rec.epoch}"
    # The history keeps how an earlier incarnation ended, not its nodes' lines (nor its handle to read
    # them by): only the current incarnation's output is read, whatever the adapter still keeps.
    return (
        f"the output of {rec.job_id}'s incarnation {n} cannot be read: dispatch reads the current "
        f"incarnation's ({rec.epoch}) only, and on Kubernetes an incarnation's pods, with their logs, are "
        "removed before the next one starts (Slurm keeps the output files in the incarnation's directory "
        f"under its workdir); how incarnation {n} ended is in `{opts.again('describe', rec.job_id)}` and "
        f"`{opts.again('history', rec.job_id)}`"
    )


# ---------------------------------------------------------------------- clusters and adapters


COMMANDS = (status, list_, watch, history, describe_, logs)
