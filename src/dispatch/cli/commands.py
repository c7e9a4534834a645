"""The ``dispatch`` commands (click). See ``docs/cli.md``.

Exit codes: 0 success; 1 a job ended failed/lost/cancelled, or a dispatch error other than invalid input;
2 usage or validation errors (``InvalidError``); 130 interrupted.
"""

from __future__ import annotations

import asyncio
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

from dispatch import decide
from dispatch.cli import devcluster
from dispatch.cli.config import ClusterFile, load_config, open_cluster, read_limited, read_token
from dispatch.cli.embedded import OfflineBackend, gone_jobs, mark
from dispatch.cli.render import Renderer, probe_progress, when
from dispatch.cluster import Cluster
from dispatch.errors import ConflictError, DispatchError, InvalidError, UnavailableError, UnsupportedError
from dispatch.logs import SECRETS
from dispatch.model import JobRecord, JobSpec, State
from dispatch.registry import describe, load_installed
from dispatch.supervise import StepReport, UnmatchedPolicy

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

    async def open(
        self, *, read_only: bool = False, refresh: bool = False, start_dev: bool = True
    ) -> tuple[Cluster, ClusterFile]:
        """Open the configured cluster; ``read_only`` forces read-only mode (no probe, no write).

        With no config (the embedded default) a write command starts the dev cluster when it is not
        running, and says so; a read command does not, and sees the records as last known. Without
        ``start_dev`` (a daemon reconnecting: the user may have stopped it on purpose) that is an
        ``UnavailableError``."""
        cf = self.cluster_file()
        token = read_token(self.token_file)  # a bad token file is reported before anything starts
        if read_only:
            cf = cf.replace(read_only=True)
        if cf.embedded:
            dev = devcluster.running()
            if dev is None and read_only:
                return Cluster(OfflineBackend(cf.adapter), cf.store.open(), policy=cf.policy), cf
            if dev is None and not start_dev:
                raise UnavailableError(
                    "the dev cluster is not running (`dispatch dev-cluster start` starts it)"
                )
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
    except Exception as exc:  # a bug below us: still one line (no traceback), and a failure exit code
        report_unexpected(opts, exc)
        raise click.exceptions.Exit(EXIT_FAILED) from None
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


def report_unexpected(opts: Options | None, exc: BaseException) -> None:
    """One line for an exception that is not a dispatch error (a defect: please report it). The token
    is cut out of the message, in case a library below us quoted it."""
    try:
        token = read_token(opts.token_file if opts is not None else None)
    except Exception:  # an unreadable token file: nothing of it can be in the message to hide
        token = None
    if token:
        SECRETS.add(token)
    message = SECRETS.scrub(" ".join(str(exc).split()) or "(no message)")
    if len(message) > 300:
        message = message[:297] + "..."
    click.echo(
        f"error: unexpected {type(exc).__name__}: {message} (this is a dispatch defect; please report it)",
        err=True,
    )
    if opts is not None and opts.as_json:
        body = {"type": type(exc).__name__, "message": message, "unexpected": True}
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
@click.option(
    "--no-supervise",
    is_flag=True,
    help="Only follow the job: apply no recovery policy (a preempted job ends failed / preempted).",
)
@common
def run(opts: Options, jobfile: str, job_id: str | None, no_supervise: bool) -> None:
    """Submit JOBFILE and supervise it to its final outcome, printing every transition.

    The cluster's recovery policy applies: a job preempted, evicted or whose node was lost comes back as
    its next incarnation (see `dispatch history JOB`)."""
    execute(opts, _run(opts, jobfile, job_id, supervise=not no_supervise))


async def _run(opts: Options, jobfile: str, job_id: str | None, *, supervise: bool) -> int:
    spec = load_job(jobfile)  # a typo in the job file is reported before the cluster is opened
    cluster, cf = await opts.open()
    async with cluster:
        rec = await cluster.submit(spec, job_id=job_id)
        await _mark(cf, cluster, rec.job_id)
        try:
            return await _follow(opts, cluster, rec, supervise=supervise)
        except asyncio.CancelledError:  # Ctrl-C: the job is not ours to drop; say where it is
            where = " on the dev cluster" if cf.embedded else ""
            opts.say(await _interrupted(cluster, rec.job_id, where))
            raise


async def _interrupted(cluster: Cluster, job_id: str, where: str) -> str:
    """What Ctrl-C during ``run`` leaves behind, in words: a job waiting to be (re)started (a requeue's
    backoff) has nothing to start it until a supervisor runs, and that must be said."""
    try:
        rec = await asyncio.shield(cluster.store.get(job_id))
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
            current = await cluster.store.get(jid)
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
    return EXIT_OK if rec.state is State.SUCCEEDED else EXIT_FAILED


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


@cli.command()
@click.option(
    "--lease",
    type=click.FloatRange(min=1.0, max=86400),
    default=30.0,
    show_default=True,
    help="Seconds a lease on a record lasts (renewed at half); a dead supervisor's records are taken over after it.",
)
@click.option(
    "--poll",
    type=click.FloatRange(min=0.05, max=3600),
    default=2.0,
    show_default=True,
    help="Seconds between polls (and between checks of an old incarnation's lingering compute).",
)
@click.option(
    "--resync",
    type=click.FloatRange(min=0, max=86400),
    default=60.0,
    show_default=True,
    help="Seconds between full listings of the cluster (reconciliation).",
)
@click.option(
    "--unmatched",
    type=click.Choice([u.value for u in UnmatchedPolicy]),
    default=UnmatchedPolicy.IGNORE.value,
    show_default=True,
    help="What to do with cluster objects that carry dispatch's identity but match no record.",
)
@click.option("--holder", metavar="NAME", help="This supervisor's name in leases (default: host:pid:random).")
@click.option("--once", is_flag=True, help="Take one step and exit (releasing the leases).")
@click.option(
    "--metrics-address",
    metavar="HOST:PORT",
    help="Serve Prometheus metrics at http://HOST:PORT/metrics (needs the metrics extra).",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default=None,
    help="Write structured logs to stderr: one JSON object per line, or text.",
)
@common
def supervise(
    opts: Options,
    lease: float,
    poll: float,
    resync: float,
    unmatched: str,
    holder: str | None,
    once: bool,
    metrics_address: str | None,
    log_format: str | None,
) -> None:
    """Run the supervisor: apply the recovery policy to every job of the store until SIGTERM/SIGINT.

    On SIGTERM or SIGINT it finishes the step in hand, releases its leases and exits 0. Several
    supervisors may run over one store; they split the jobs by lease."""
    execute(opts, _supervise(opts, lease, poll, resync, unmatched, holder, once, metrics_address, log_format))


async def _supervise(
    opts: Options,
    lease: float,
    poll: float,
    resync: float,
    unmatched: str,
    holder: str | None,
    once: bool,
    metrics_address: str | None = None,
    log_format: str | None = None,
) -> int:
    import signal

    from dispatch import health, logs, metrics

    out = opts.out
    if log_format is not None:
        logs.configure(log_format)
    if metrics_address is not None:
        metrics.enable(metrics_address)
    if lease <= 2 * poll:
        raise InvalidError(
            f"--lease ({lease:g} s) must be more than twice --poll ({poll:g} s)", path="--lease"
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        attempt = 0
        first = True  # only the first attempt may start the dev cluster
        while True:
            # Each attempt re-reads the configuration (cluster file, kubeconfig, token): a restarted
            # cluster may have moved, a token may have been renewed.
            try:
                cluster, cf = await opts.open(start_dev=first)
            except (InvalidError, UnsupportedError):
                raise  # the configuration itself is wrong: retrying cannot help
            except DispatchError as exc:
                if once:
                    raise
                delay = health.reconnect_delay(attempt)
                attempt += 1
                first = False
                health.READINESS.not_ready(f"cannot open the cluster: {exc}")
                if out.as_json:
                    out.json({"event": "cannot-open", "error": str(exc), "retryIn": round(delay, 1)})
                else:
                    out.line(
                        f"{when(time.time())}  cannot open the cluster ({exc}); retrying in {delay:.1f} s",
                        style="red",
                    )
                if await _stopped_within(stop, delay):
                    return EXIT_OK
                continue
            attempt = 0
            first = False
            result = await _supervise_opened(
                opts, cluster, cf, stop, lease, poll, resync, unmatched, holder, once
            )
            if result is not None:
                return result
            if out.as_json:
                out.json({"event": "reconnecting"})
            else:
                out.line(f"{when(time.time())}  lost the cluster; reconnecting")
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


async def _stopped_within(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds`` or until ``stop`` is set; whether it was."""
    try:
        async with asyncio.timeout(seconds):
            await stop.wait()
    except TimeoutError:
        return False
    return True


UNREACHABLE_STEPS = 3
"""Steps in a row that failed before the daemon checks whether its cluster is still there."""


async def _supervise_opened(
    opts: Options,
    cluster: Cluster,
    cf: ClusterFile,
    stop: asyncio.Event,
    lease: float,
    poll: float,
    resync: float,
    unmatched: str,
    holder: str | None,
    once: bool,
) -> int | None:
    """Supervise on one opened cluster until told to stop (the exit code) or until the cluster stops
    answering (``None``: the caller reconnects)."""
    from dispatch import health, metrics

    out = opts.out
    async with cluster:
        # Records of a stopped dev cluster are not this cluster's to recover: left as last known.
        gone = await _gone(opts, cluster, await cluster.store.list())
        sup = cluster.supervisor(
            poll=poll, lease=lease, resync=resync, unmatched=unmatched, holder=holder, exclude=gone
        )
        say = out.json if out.as_json else None
        port = metrics.served_port()
        if say is not None:
            say(
                {"supervisor": sup.holder, "adapter": cf.adapter, "store": str(cf.store), "event": "started"}
                | ({"metricsPort": port} if port is not None else {})
            )
        else:
            served = f"; metrics on port {port}" if port is not None else ""
            out.line(f"supervisor {sup.holder} on {cf.adapter} ({cf.store}): started{served}")
        if gone:
            note = f"left alone: {len(gone)} job(s) of a dev cluster that is gone ({', '.join(sorted(gone)[:5])})"
            if say is not None:
                say({"supervisor": sup.holder, "event": "left-alone", "jobs": sorted(gone)})
            else:
                out.line(note)

        failed: list[str] = []  # what went wrong in a --once step: the exit code says so
        failing = 0  # steps in a row with errors
        lost = False

        async def report(r: StepReport) -> None:
            nonlocal failing
            failed.extend(r.errors)
            failing = failing + 1 if r.errors else 0
            if r.errors:
                health.READINESS.not_ready(f"the last step failed: {r.errors[0]}")
            else:
                health.READINESS.ready()
            for a in r.actions:
                if say is not None:
                    say({"supervisor": sup.holder, "action": a})
                else:
                    out.line(f"{when(cluster.clock.now())}  {a}")
            for e in r.errors:
                if say is not None:
                    say({"supervisor": sup.holder, "error": e})
                else:
                    out.line(f"{when(cluster.clock.now())}  error: {e}", style="red")

        async def done() -> bool:
            nonlocal lost
            if once:
                return True
            if failing >= UNREACHABLE_STEPS:
                try:  # failing steps: is the cluster still there? (a restarted one may have moved)
                    await cluster.backend.capabilities()
                    await cluster.backend.list()
                except DispatchError as exc:
                    health.READINESS.not_ready(f"lost the cluster: {exc}")
                    lost = True
                    return True
            return False

        await sup.run(stop=stop, until=done, on_step=report)
        if lost and not stop.is_set():
            return None
        if say is not None:
            say({"supervisor": sup.holder, "event": "stopped"} | ({"failed": len(failed)} if once else {}))
        else:
            out.line(f"supervisor {sup.holder}: stopped, leases released")
        if once and failed:
            # A one-shot run (cron, CI) must not read as success when its actions failed.
            out.line(f"error: {len(failed)} action(s) of this step failed (see above)", style="red")
            return EXIT_FAILED
        return EXIT_OK


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
    """Show the transitions of JOB, oldest first, then every incarnation and why it ended."""

    async def act(cluster: Cluster) -> int:
        opts.out.transitions(job, await cluster.history(job), incarnations=True)
        return EXIT_OK

    execute(opts, _with_cluster(opts, act, read_only=True))


@cli.command()
@click.argument("job")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the node's output ends.")
@click.option("--node", default=0, show_default=True, type=click.IntRange(min=0), help="Node index.")
@click.option("--tail", type=click.IntRange(min=0), help="Only the last N lines.")
@click.option(
    "--previous", "-p", is_flag=True, help="The node's last terminated run (a node that restarted in place)."
)
@common
def logs(opts: Options, job: str, follow: bool, node: int, tail: int | None, previous: bool) -> None:
    """Print the output of one node of JOB."""

    async def act(cluster: Cluster) -> int:
        out = opts.out
        async for line in cluster.output(job, node=node, follow=follow, tail=tail, previous=previous):
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
        try:  # the store is opened lazily: read from it, so a store down or refusing us fails here
            await cluster.store.list(states=[State.PENDING])
        except DispatchError as exc:
            raise type(exc)(f"the store {cf.store} cannot be read: {exc}") from None
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
    except Exception as exc:  # outside a command's body (option parsing, a plugin): still one line
        report_unexpected(None, exc)
        sys.exit(EXIT_FAILED)
