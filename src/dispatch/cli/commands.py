"""The ``dispatch`` commands (click). See ``docs/cli.md``.

Exit codes: 0 success; 1 a job ended failed/lost/cancelled, or a dispatch error other than invalid input;
2 usage or validation errors (``InvalidError``); 130 interrupted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable, Coroutine, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click

from dispatch.cli import devcluster
from dispatch.cli.config import ClusterFile, load_config, open_cluster, read_limited, read_token
from dispatch.cli.embedded import OfflineBackend, gone_jobs, mark
from dispatch.cli.render import Renderer, probe_progress
from dispatch.cluster import Cluster
from dispatch.errors import ConflictError, DispatchError, InvalidError, UnsupportedError
from dispatch.model import JobRecord, JobSpec, State
from dispatch.registry import describe, load_installed

__all__ = ["EXIT_FAILED", "EXIT_INVALID", "EXIT_OK", "cli", "load_spec"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_INTERRUPTED = 130

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True, slots=True)
class Options:
    """The options every command takes."""

    config: str | None
    token_file: str | None
    as_json: bool

    @property
    def out(self) -> Renderer:
        return Renderer(as_json=self.as_json)

    def cluster_file(self) -> ClusterFile:
        return load_config(self.config)

    async def open(self, *, read_only: bool = False, refresh: bool = False) -> tuple[Cluster, ClusterFile]:
        """Open the configured cluster; ``read_only`` forces read-only mode (no probe, no write).

        With no config (the embedded default) a write command starts the dev cluster when it is not
        running, and says so; a read command does not, and sees the records as last known."""
        cf = self.cluster_file()
        token = read_token(self.token_file)  # a bad token file is reported before anything starts
        if read_only:
            cf = dataclasses.replace(cf, read_only=True)
        if cf.embedded:
            dev = devcluster.running()
            if dev is None and read_only:
                return Cluster(OfflineBackend(cf.adapter), cf.store.open(), policy=cf.policy), cf
            if dev is None:
                dev, started = devcluster.start()
                if started:
                    self.say(
                        f"started the dev cluster (kubesim, pid {dev.pid}) in the background at {dev.url}; "
                        "it keeps your jobs between commands. `dispatch dev-cluster stop` stops it."
                    )
        with self.opening(cf):
            return await open_cluster(cf, token=token, refresh=refresh), cf

    def say(self, text: str) -> None:
        """A note for people, on stderr (stdout stays the command's result)."""
        click.echo(text, err=True)

    def opening(self, cf: ClusterFile) -> AbstractContextManager[Any]:
        """Nothing waits silently: while the adapter opens, what it waits for (its probe) is shown — a
        spinner on a terminal, lines on stderr otherwise (never with ``--json``)."""
        where = "the dev cluster" if cf.embedded else f"the {cf.adapter} cluster ({cf.source})"
        return probe_progress(self.out, f"opening {where}", self.as_json)


def common(fn: F) -> F:
    """Add ``--config``, ``--token-file`` and ``--json`` and pass them as one :class:`Options`."""

    @click.option(
        "--config",
        "config",
        metavar="PATH",
        help="Cluster config file (YAML). Default: $DISPATCH_CONFIG, else the embedded default.",
    )
    @click.option(
        "--token-file", metavar="PATH", help="File holding the bearer token (else $DISPATCH_TOKEN)."
    )
    @click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
    @functools.wraps(fn)
    def wrapper(config: str | None, token_file: str | None, as_json: bool, **kwargs: Any) -> Any:
        # The same options given before the command (`dispatch --json list`) are the defaults.
        outer = click.get_current_context().find_root().obj
        if isinstance(outer, Options):
            config = config or outer.config
            token_file = token_file or outer.token_file
            as_json = as_json or outer.as_json
        return fn(Options(config, token_file, as_json), **kwargs)

    return wrapper  # type: ignore[return-value]


def execute(opts: Options, coro: Coroutine[Any, Any, int | None]) -> None:
    """Run one command's coroutine; turn dispatch errors into one line and an exit code."""
    try:
        code = asyncio.run(coro)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
    except DispatchError as exc:
        report_error(opts, exc)
        raise click.exceptions.Exit(EXIT_INVALID if isinstance(exc, InvalidError) else EXIT_FAILED) from None
    if code:
        raise click.exceptions.Exit(code)


def report_error(opts: Options, exc: DispatchError) -> None:
    click.echo(f"error: {exc}", err=True)
    if opts.as_json:
        body: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
        if isinstance(exc, InvalidError) and exc.path:
            body["path"] = exc.path
        if isinstance(exc, UnsupportedError):
            body["reasons"] = list(exc.reasons)
        click.echo(json.dumps({"error": body}, sort_keys=True))


def load_spec(jobfile: str) -> JobSpec:
    """Read a job file (YAML; JSON when it ends ``.json``) strictly. Errors name the file and the path."""
    path = Path(jobfile)
    data = read_limited(path, "job file")  # a 50 MB job file would take seconds and bloat the store
    try:
        return JobSpec.loads(data, format="json" if path.suffix == ".json" else "yaml")
    except InvalidError as exc:
        err = InvalidError(exc.detail, path=exc.path)
        err.args = (f"{jobfile}: {exc}",)
        raise err from None


def load_job(jobfile: str) -> JobSpec:
    """Read a job file with every installed adapter's extension types known."""
    load_adapter_extensions()
    return load_spec(jobfile)


def load_adapter_extensions() -> None:
    """Load every installed adapter, so that its extension types decode (e.g. ``kubeflow/RuntimeRef``)."""
    load_installed()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="dispatch")
@click.option("--config", "config", metavar="PATH", help="Cluster config file (default: $DISPATCH_CONFIG).")
@click.option("--token-file", metavar="PATH", help="File holding the bearer token (else $DISPATCH_TOKEN).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.pass_context
def cli(ctx: click.Context, config: str | None, token_file: str | None, as_json: bool) -> None:
    """dispatch: submit and supervise training jobs, with typed outcomes.

    --config, --token-file and --json may be given before the command or after it.
    """
    ctx.obj = Options(config, token_file, as_json)


# ---------------------------------------------------------------------- jobs


@cli.command()
@click.argument("jobfile", type=click.Path(dir_okay=False))
@click.option("--job-id", metavar="ID", help="Job id (default: generated).")
@common
def run(opts: Options, jobfile: str, job_id: str | None) -> None:
    """Submit JOBFILE and follow it to its outcome, printing every transition."""
    execute(opts, _run(opts, jobfile, job_id))


async def _run(opts: Options, jobfile: str, job_id: str | None) -> int:
    spec = load_job(jobfile)  # a typo in the job file is reported before the cluster is opened
    cluster, cf = await opts.open()
    async with cluster:
        rec = await cluster.submit(spec, job_id=job_id)
        await _mark(cf, cluster, rec.job_id)
        try:
            return await _follow(opts, cluster, rec)
        except asyncio.CancelledError:  # Ctrl-C: the job is not ours to drop; say where it is
            where = " on the dev cluster" if cf.embedded else ""
            opts.say(
                f"interrupted: job {rec.job_id} keeps running{where}; "
                f"`dispatch status {rec.job_id}` follows it, `dispatch cancel {rec.job_id}` cancels it"
            )
            raise


async def _follow(opts: Options, cluster: Cluster, rec: JobRecord) -> int:
    """Print every transition of the job until its outcome is final; the exit code of the outcome.

    On a terminal a live line shows the job's state, cause and elapsed time, redrawn every second."""
    out = opts.out
    printed = 0
    started = time.monotonic()
    with out.progress(_live_line(rec, started)) as status:
        ticker = asyncio.create_task(_tick(status, lambda: _live_line(rec, started))) if status else None
        try:
            async for rec in cluster.watch(rec.job_id):  # noqa: B020 - the last record is the outcome
                history = await cluster.history(rec.job_id)
                for t in history[printed:]:
                    out.transition(rec.job_id, t)
                printed = len(history)
                if status is not None:
                    status.update(_live_line(rec, started))
        finally:
            if ticker is not None:
                ticker.cancel()
    out.outcome(rec)
    return EXIT_OK if rec.state is State.SUCCEEDED else EXIT_FAILED


def _live_line(rec: JobRecord, started: float) -> str:
    cause = "" if rec.outcome.cause.value == "none" else f" ({rec.outcome.cause.value})"
    return f"{rec.job_id}@{rec.epoch}: {rec.state.value}{cause}  {time.monotonic() - started:.0f}s"


async def _tick(status: Any, text: Callable[[], str]) -> None:
    while True:
        await asyncio.sleep(1.0)
        status.update(text())


@cli.command()
@click.argument("jobfile", type=click.Path(dir_okay=False))
@common
def validate(opts: Options, jobfile: str) -> None:
    """Check JOBFILE strictly; with a cluster config (or a running dev cluster), also ask the cluster,
    read-only, whether it would accept the job."""
    execute(opts, _validate(opts, jobfile))


async def _validate(opts: Options, jobfile: str) -> int:
    spec = load_spec(jobfile)
    if spec.extensions.opaque():
        load_adapter_extensions()
        spec = load_spec(jobfile)
    opaque = spec.extensions.opaque()
    if opaque:
        raise UnsupportedError(
            [f"{jobfile}: extension {name!r} is not known to any installed adapter" for name in opaque]
        )
    asked = await _ask_cluster(opts, spec)
    out = opts.out
    if out.as_json:
        out.json({"valid": True, "spec": spec.to_json(), "cluster": asked})
    else:
        exts = ", ".join(spec.extensions) or "none"
        out.line(f"ok: {jobfile}: {spec.nodes} node(s), command {list(spec.command)}, extensions: {exts}")
        if asked:
            out.line(f"ok: {asked}")
    return EXIT_OK


async def _ask_cluster(opts: Options, spec: JobSpec) -> str | None:
    """With a cluster config (or a running dev cluster), ask the cluster read-only whether it would
    accept the job: every check a submit makes (``prepare``), creating nothing. ``None``: not asked."""
    import os

    from dispatch.cli.config import CONFIG_ENV

    if not (opts.config or os.environ.get(CONFIG_ENV)) and devcluster.running() is None:
        return None
    cluster, cf = await opts.open(read_only=True)
    async with cluster:
        await cluster.dry_run(spec)
        for note in (await cluster.capabilities(spec)).notes:
            if note.startswith("warning:"):
                opts.say(note)
    return f"the {cf.adapter} cluster ({cf.source}) would accept it (asked read-only; nothing created)"


@cli.command()
@click.argument("jobfile", type=click.Path(dir_okay=False))
@click.option("--held", is_flag=True, help="Create it held: it waits for `dispatch release`.")
@click.option("--dry-run", is_flag=True, help="Print the native object it would create; create nothing.")
@click.option("--job-id", metavar="ID", help="Job id (default: generated).")
@common
def submit(opts: Options, jobfile: str, held: bool, dry_run: bool, job_id: str | None) -> None:
    """Submit JOBFILE and print its record (do not wait)."""
    execute(opts, _submit(opts, jobfile, held, dry_run, job_id))


async def _submit(opts: Options, jobfile: str, held: bool, dry_run: bool, job_id: str | None) -> int:
    out = opts.out
    spec = load_job(jobfile)
    # A dry run only reads, so the cluster is opened read-only: no probe, and no write can leave.
    cluster, cf = await opts.open(read_only=dry_run)
    async with cluster:
        if dry_run:
            out.mapping(await cluster.dry_run(spec, job_id=job_id, held=held))
            return EXIT_OK
        rec = await cluster.submit(spec, job_id=job_id, held=held)
        await _mark(cf, cluster, rec.job_id)
        out.summary(rec, "submitted")
        return EXIT_OK


@cli.command()
@click.argument("job")
@common
def status(opts: Options, job: str) -> None:
    """Show the record of JOB, refreshed from the cluster (read-only: no probe, no write)."""
    execute(opts, _with_cluster(opts, lambda c: _status(opts, c, job), read_only=True))


async def _status(opts: Options, cluster: Cluster, job: str) -> int:
    rec = await cluster.store.get(job)
    gone = await _gone(opts, cluster, [rec])
    if job in gone:
        opts.out.record(rec, gone=gone[job])
        return EXIT_OK
    opts.out.record(await cluster.get(job))
    return EXIT_OK


async def _mark(cf: ClusterFile, cluster: Cluster, job_id: str) -> None:
    """On the embedded default, remember which dev cluster instance runs the job."""
    if cf.embedded:
        dev = devcluster.running()
        if dev is not None:
            await mark(cluster.store, job_id, dev)


async def _refuse_gone_offline(opts: Options, job: str) -> None:
    """Before a write command starts the dev cluster: refuse at once if the job's cluster is gone."""
    cf = opts.cluster_file()
    if not cf.embedded or devcluster.running() is not None:
        return
    store = cf.store.open()
    try:
        gone = await gone_jobs(store, [await store.get(job)], None)
    finally:
        await store.close()
    if job in gone:
        raise ConflictError(f"job {job!r}: {gone[job]}")


async def _refuse_gone(opts: Options, cluster: Cluster, job: str, what: str) -> None:
    gone = await _gone(opts, cluster, [await cluster.store.get(job)])
    if job in gone:
        raise ConflictError(f"cannot {what} job {job!r}: {gone[job]}")


async def _gone(opts: Options, cluster: Cluster, records: list[JobRecord]) -> Mapping[str, str]:
    """Records of jobs whose (dev) cluster is gone: shown as last known, never refreshed to ``lost``."""
    if not opts.cluster_file().embedded:
        return {}
    return await gone_jobs(cluster.store, records, devcluster.running())


@cli.command("list")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([s.value for s in State]),
    help="Only jobs in this state (repeatable).",
)
@common
def list_(opts: Options, states: tuple[str, ...]) -> None:
    """List every job, refreshed from the cluster (read-only: no probe, no write)."""
    wanted = [State(s) for s in states] or None
    execute(opts, _with_cluster(opts, lambda c: _list(opts, c, wanted), read_only=True))


async def _list(opts: Options, cluster: Cluster, states: list[State] | None) -> int:
    stored = await cluster.store.list()
    gone = await _gone(opts, cluster, stored)
    if isinstance(cluster.backend, OfflineBackend):  # no cluster to ask: the records as last known
        records = [r for r in stored if states is None or r.state in states]
    elif not gone:
        records = await cluster.list(states)
    else:  # refresh the others one by one; the gone ones stay as last known
        records = [
            r if r.job_id in gone or r.outcome.terminal else await cluster.get(r.job_id) for r in stored
        ]
        records = [r for r in records if states is None or r.state in states]
    opts.out.records(records, gone=gone)
    return EXIT_OK


@cli.command()
@click.argument("job", required=False)
@common
def watch(opts: Options, job: str | None) -> None:
    """Print records as they change (one job until it ends, or every job until interrupted)."""
    execute(opts, _with_cluster(opts, lambda c: _watch(opts, c, job), read_only=True))


async def _watch(opts: Options, cluster: Cluster, job: str | None) -> int:
    out = opts.out
    if job is not None:
        gone = await _gone(opts, cluster, [await cluster.store.get(job)])
        if job in gone:  # nothing will change any more: say so rather than wait, or call it lost
            out.record(await cluster.store.get(job), gone=gone[job])
            return EXIT_OK
    with out.live_jobs() as live:  # a line per job on a terminal; one line per change otherwise
        async for rec in cluster.watch(job):
            if live is not None:
                live.update(rec)
            else:
                out.summary(rec)
    return EXIT_OK


def _write_command(name: str, help_text: str) -> None:
    @cli.command(name, help=help_text)
    @click.argument("job")
    @common
    def command(opts: Options, job: str) -> None:
        async def act(cluster: Cluster) -> int:
            await _refuse_gone(opts, cluster, job, name)
            method = getattr(cluster, name)
            rec = await method(job)
            opts.out.summary(rec, name)
            return EXIT_OK

        execute(opts, _with_cluster(opts, act, job=job))


_write_command("cancel", "Cancel JOB.")
_write_command("hold", "Hold JOB (keep it from running) until released.")
_write_command("release", "Release the hold on JOB.")


@cli.command()
@click.argument("job")
@click.argument("jobfile", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--wait",
    type=click.FloatRange(0, 86400),
    default=60.0,
    show_default=True,
    help="Seconds to wait for the previous incarnation's compute to go before giving up.",
)
@common
def resubmit(opts: Options, job: str, jobfile: str | None, wait: float) -> None:
    """Start a new incarnation of finished JOB (with JOBFILE's spec, if given), once the previous
    incarnation's compute is gone."""

    async def act(cluster: Cluster) -> int:
        spec = load_spec(jobfile) if jobfile else None
        await _refuse_gone(opts, cluster, job, "resubmit")
        rec = await cluster.resubmit(job, spec, wait=wait)
        await _mark(opts.cluster_file(), cluster, rec.job_id)
        opts.out.summary(rec, "resubmitted")
        return EXIT_OK

    execute(opts, _with_cluster(opts, act, job=job))


@cli.command()
@click.argument("job")
@common
def history(opts: Options, job: str) -> None:
    """Show the transitions of JOB, oldest first."""

    async def act(cluster: Cluster) -> int:
        opts.out.transitions(job, await cluster.history(job))
        return EXIT_OK

    execute(opts, _with_cluster(opts, act, read_only=True))


@cli.command()
@click.argument("job")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the node's output ends.")
@click.option("--node", default=0, show_default=True, type=click.IntRange(min=0), help="Node index.")
@click.option("--tail", type=click.IntRange(min=0), help="Only the last N lines.")
@common
def logs(opts: Options, job: str, follow: bool, node: int, tail: int | None) -> None:
    """Print the output of one node of JOB."""

    async def act(cluster: Cluster) -> int:
        out = opts.out
        async for line in cluster.output(job, node=node, follow=follow, tail=tail):
            if out.as_json:
                out.json({"jobId": job, "node": node, "line": line})
            else:
                out.line(line)
        return EXIT_OK

    execute(opts, _with_cluster(opts, act, read_only=True))


async def _with_cluster(
    opts: Options,
    act: Callable[[Cluster], Coroutine[Any, Any, int]],
    *,
    read_only: bool = False,
    job: str | None = None,
) -> int:
    """Open the cluster (read-only for read commands: no probe, no write request), run ``act``.
    ``job``: the job a write command acts on; when its dev cluster is gone, nothing is started."""
    if job is not None and not read_only:
        await _refuse_gone_offline(opts, job)
    cluster, _ = await opts.open(read_only=read_only)
    async with cluster:
        return await act(cluster)


# ---------------------------------------------------------------------- clusters and adapters


@cli.command()
@click.option("--read-only", is_flag=True, help="Open read-only: no probe, no write (what a dashboard sees).")
@click.option("--refresh", is_flag=True, help="Probe again, ignoring the findings cached in the store.")
@common
def check(opts: Options, read_only: bool, refresh: bool) -> None:
    """Open the configured cluster and print its capabilities."""
    if read_only and refresh:
        raise click.UsageError("--refresh probes, --read-only never does: give one of them")
    execute(opts, _check(opts, read_only=read_only, refresh=refresh))


@cli.command("open")
@common
def open_(opts: Options) -> None:
    """Open the configured cluster and print its capabilities (the same as `check`)."""
    execute(opts, _check(opts))


async def _check(opts: Options, *, read_only: bool = False, refresh: bool = False) -> int:
    cluster, cf = await opts.open(read_only=read_only, refresh=refresh)
    async with cluster:
        caps = await cluster.capabilities()
        opts.out.capabilities(cf.adapter, cf.source, str(cf.store), caps)
    return EXIT_OK


@cli.command()
@click.argument("adapter")
@common
def schema(opts: Options, adapter: str) -> None:
    """Print the JSON Schema of ADAPTER's settings."""

    async def act() -> int:
        value = adapter_schema(adapter)
        opts.out.mapping(value, yaml_form=False)
        return EXIT_OK

    execute(opts, act())


def adapter_schema(name: str) -> dict[str, Any]:
    """The settings schema adapter ``name`` publishes (its descriptor's ``schema``)."""
    return describe(name).settings_schema()


@cli.command("adapters")
@common
def adapters_(opts: Options) -> None:
    """List the adapters available: registered in this process or installed (entry points)."""
    found = load_installed()
    out = opts.out
    if out.as_json:
        out.json(
            [
                {
                    "name": a.name,
                    "summary": a.summary,
                    "extensions": sorted(a.extensions),
                    "schema": a.schema is not None,
                }
                for a in found
            ]
        )
        return
    out.table(
        ["adapter", "extensions", "what it is"],
        [[a.name, ", ".join(sorted(a.extensions)) or "-", a.summary] for a in found],
    )


cli.add_command(devcluster.command)


def main(argv: list[str] | None = None) -> None:
    """The console script's entry: run the CLI."""
    try:
        cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="dispatch")
    except BrokenPipeError:
        # The reader went away (`dispatch list | head -1`): stop quietly, like other Unix tools.
        import os

        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        sys.exit(EXIT_FAILED)
