"""The ``dispatch`` commands (click). See ``docs/cli.md``.

Exit codes: 0 success; 1 a job ended failed/lost/cancelled, or a dispatch error other than invalid input;
2 usage or validation errors (``InvalidError``); 130 interrupted.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
import time
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click
from msgspec import Struct

from dispatch import decide
from dispatch.cli import devcluster
from dispatch.cli.config import (
    ClusterFile,
    check_settings,
    load_config,
    open_cluster,
    read_limited,
    read_token,
)
from dispatch.cli.embedded import OfflineBackend, gone_jobs, mark
from dispatch.cli.render import Renderer, probe_progress, when
from dispatch.cluster import Cluster
from dispatch.errors import (
    BusyError,
    ConflictError,
    DispatchError,
    InvalidError,
    NotFoundError,
    ReadOnlyError,
    UnavailableError,
    UnsupportedError,
)
from dispatch.logs import SECRETS
from dispatch.logs import structured as structured_logs
from dispatch.model import JobRecord, JobSpec, State
from dispatch.registry import describe as describe_adapter
from dispatch.registry import load_installed

if TYPE_CHECKING:  # the supervisor (and its health endpoint's HTTP server) loads only for `supervise`
    from dispatch.supervise import StepReport

__all__ = ["EXIT_FAILED", "EXIT_INVALID", "EXIT_OK", "UNMATCHED", "cli", "load_spec"]

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_ALREADY_ENDED = 3
"""A write (``cancel``) found the job already ended: nothing was done (not a failure of the job)."""
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
"""The reader of stdout went away (``| head``): 128 + SIGPIPE, as for a tool SIGPIPE ended."""

DISTRIBUTION = "dispatch-train"
"""The distribution (package index) name; the import package is ``dispatch``."""

F = TypeVar("F", bound=Callable[..., Any])


UNMATCHED = ("ignore", "adopt", "delete")
"""``supervise --unmatched``: the values of :class:`dispatch.supervise.UnmatchedPolicy`, default first
(spelt out so that no other command imports the supervisor; a test holds them equal)."""

OUTPUTS = ("text", "json", "yaml", "wide", "name")
"""``-o``: people's text (tables), JSON, YAML, a table with more columns, or only the job ids."""

READ = "read"
WRITE = "write"
"""How a command opens the cluster: read-only (no probe, no write request) or for writing."""


class Options(Struct):
    """The options every command takes."""

    config: str | None
    token_file: str | None
    output: str = "text"
    no_headers: bool = False
    quiet: bool = False
    epoch_times: bool = False
    cluster: str | None = None
    namespace: str | None = None
    context: str | None = None
    _cf: ClusterFile | None = None

    @property
    def as_json(self) -> bool:
        return self.output == "json"

    @property
    def out(self) -> Renderer:
        return Renderer(output=self.output, no_headers=self.no_headers, epoch_times=self.epoch_times)

    def cluster_file(self) -> ClusterFile:
        if self._cf is None:
            cf = load_config(self.config, cluster=self.cluster)
            self._cf = with_overrides(cf, {"namespace": self.namespace, "context": self.context})
        return self._cf

    async def open(
        self, *, read_only: bool = False, refresh: bool = False, start_dev: bool = True
    ) -> Cluster:
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
                return self.offline()
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
        if read_only and not refresh:  # no probe to show: the adapter opens when a call needs it
            return await open_cluster(cf, token=token, lazy=True)
        with self.opening(cf), settings_refused(cf):
            return await open_cluster(cf, token=token, refresh=refresh)

    def offline(self) -> Cluster:
        """The records of the embedded default with no dev cluster running: shown as last known."""
        cf = self.cluster_file()
        return Cluster(OfflineBackend(cf.adapter), cf.store.open(), policy=cf.policy)

    def say(self, text: str) -> None:
        """A note for people, on stderr (stdout stays the command's result); a log line with JSON logs;
        none with ``--quiet``."""
        if self.quiet:
            return
        if structured_logs():
            logging.getLogger("dispatch.cli").info("%s", text)
        else:
            click.echo(text, err=True)

    def opening(self, cf: ClusterFile) -> AbstractContextManager[Any]:
        """Nothing waits silently: while the adapter opens, what it waits for (its probe) is shown — a
        spinner on a terminal, lines on stderr otherwise (never with ``--json`` or ``--quiet``)."""
        where = "the dev cluster" if cf.embedded else f"the {cf.adapter} cluster ({cf.source})"
        # With JSON logs the probe's lines are already log lines: no plain copy on stderr.
        quiet = self.output != "text" or self.quiet or structured_logs()
        return probe_progress(self.out, f"opening {where}", quiet)


def with_overrides(cf: ClusterFile, given: Mapping[str, str | None]) -> ClusterFile:
    """``-n/--namespace`` and ``--context`` (kubectl's): settings of the adapter, for an adapter that has
    them (Kubernetes ones); refused, naming the adapter, for one that has not."""
    changes = {k: v for k, v in given.items() if v is not None}
    if not changes:
        return cf
    known = describe_adapter(cf.adapter).settings_schema().get("properties", {})
    for key in changes:
        if key not in known:
            flag = "-n/--namespace" if key == "namespace" else f"--{key}"
            raise InvalidError(
                f"{flag}: the {cf.adapter} adapter ({cf.source}) has no {key} setting", path=f"--{key}"
            )
    cf = cf.replace(settings={**cf.settings, **changes})
    check_settings(cf)
    return cf


COMMON = (
    "config",
    "token_file",
    "as_json",
    "output",
    "no_headers",
    "quiet",
    "epoch_times",
    "cluster",
    "namespace",
    "context",
)
"""The common options' parameter names (see :func:`_common_options`)."""


def _options(given: Mapping[str, Any], outer: Options | None = None) -> Options:
    """The common options given (to the group or a command); those of the group (``dispatch --json
    list``) are the defaults of a command's."""
    v = dict(given)
    if outer is not None:
        for key in ("config", "token_file", "cluster", "namespace", "context"):
            v[key] = v[key] or getattr(outer, key)
        for key in ("no_headers", "quiet", "epoch_times"):
            v[key] = v[key] or getattr(outer, key)
        v["output"] = v["output"] or (None if outer.output == "text" else outer.output)
    return Options(
        v["config"],
        v["token_file"],
        _output(v["as_json"], v["output"]),
        v["no_headers"],
        v["quiet"],
        v["epoch_times"],
        v["cluster"],
        v["namespace"],
        v["context"],
    )


def _output(as_json: bool, output: str | None) -> str:
    if as_json and output not in (None, "json"):
        raise click.UsageError(f"--json is -o json; it contradicts -o {output}")
    return "json" if as_json else output or "text"


_COMMON_PARAMS: list[click.Parameter] = [
    click.Option(
        ["--config", "config"],
        metavar="PATH",
        help="Cluster config file (YAML). Default: $DISPATCH_CONFIG, else the embedded default.",
    ),
    click.Option(
        ["--token-file"], metavar="PATH", help="File holding the bearer token (else $DISPATCH_TOKEN)."
    ),
    click.Option(["--json", "as_json"], is_flag=True, help="Machine-readable JSON output (-o json)."),
    click.Option(
        ["-o", "--output"],
        type=click.Choice(OUTPUTS),
        default=None,
        help="Output format: text (default), json, yaml, wide (more columns), name (job ids only).",
    ),
    click.Option(["--no-headers"], is_flag=True, help="Tables without their header line."),
    click.Option(["--quiet", "-q"], is_flag=True, help="No notes or progress on stderr; only results."),
    click.Option(
        ["--epoch-times"], is_flag=True, help="Times in JSON/YAML as epoch seconds, not RFC 3339 text."
    ),
    click.Option(
        ["--cluster"],
        metavar="NAME",
        help="One of the clusters the config file names (`clusters:`); default: its `default`.",
    ),
    click.Option(["-n", "--namespace"], metavar="NS", help="Kubernetes: the namespace (settings.namespace)."),
    click.Option(
        ["--context"], metavar="NAME", help="Kubernetes: the kubeconfig context (settings.context)."
    ),
]
"""The common options, built once: every command shares these objects (click only reads them), where
a decorator per command built 230 of them at every start."""


def _common_options(fn: F) -> F:
    """Add the common options to a command's function (as ``@click.option`` does, in the same order)."""
    for param in reversed(_COMMON_PARAMS):
        if isinstance(fn, click.Command):
            fn.params.append(param)
        else:
            fn.__dict__.setdefault("__click_params__", []).append(param)
    return fn


Opening = str | None | Callable[[Mapping[str, Any]], str | None]


def action(opens: Opening = None, *, job: str | None = None, spec: str | None = None) -> Callable[..., Any]:
    """The one way to write a command's body: ``async def body(opts, cluster, **args) -> int | None``.

    The decorator adds the common options (``--config``, ``--token-file``, ``--json``/``-o``,
    ``--no-headers``, ``--quiet``), reads the job file named by argument ``spec`` (passed as ``spec``,
    before anything opens, so a typo is reported first), opens the cluster as ``opens`` says (``READ``,
    ``WRITE``, ``None`` for no cluster — then the body gets no ``cluster`` — or a function of the
    arguments choosing one), and closes it after. ``job``: the argument naming the job a write command
    acts on; when its dev cluster is gone, nothing is started. Errors become one line and an exit code
    (:func:`execute`)."""

    def decorate(body: Callable[..., Coroutine[Any, Any, int | None]]) -> Callable[..., None]:
        @_common_options
        @functools.wraps(body)
        def command(**kwargs: Any) -> None:
            outer = click.get_current_context().find_root().obj
            opts = _options({k: kwargs.pop(k) for k in COMMON}, outer if isinstance(outer, Options) else None)
            execute(opts, _act(opts, body, opens(kwargs) if callable(opens) else opens, job, spec, kwargs))

        return command

    return decorate


async def _act(
    opts: Options,
    body: Callable[..., Coroutine[Any, Any, int | None]],
    mode: str | None,
    job: str | None,
    spec: str | None,
    kwargs: dict[str, Any],
) -> int | None:
    if spec is not None:
        kwargs["spec"] = load_job(kwargs[spec]) if kwargs[spec] is not None else None
    if mode is None:
        return await body(opts, **kwargs)
    if job is not None and mode == WRITE:
        await _refuse_gone_offline(opts, kwargs[job])
    cluster = await opts.open(read_only=mode == READ)
    async with cluster:
        return await body(opts, cluster, **kwargs)


def complete_job(ctx: click.Context, param: click.Parameter, incomplete: str) -> list[str]:
    """Shell completion of a JOB argument: the job ids of the configured store (read as last known:
    completion never opens the cluster). Anything that goes wrong completes nothing."""
    opts = Options(ctx.params.get("config") or ctx.find_root().params.get("config"), None)

    async def ids() -> list[str]:
        async with opts.offline() as cluster:
            return [r.job_id for r in await cluster.records() if r.job_id.startswith(incomplete)]

    try:
        return asyncio.run(ids())
    except Exception:  # a broken config or store: a shell completion must never print an error
        return []


def execute(opts: Options, coro: Coroutine[Any, Any, int | None]) -> None:
    """Run one command's coroutine; turn dispatch errors into one line and an exit code."""
    try:
        code = asyncio.run(coro)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        raise click.exceptions.Exit(EXIT_INTERRUPTED) from None
    except BrokenPipeError:  # the reader went away (`| head -1`): end quietly, here for every command
        quiet_pipe()
        raise click.exceptions.Exit(EXIT_BROKEN_PIPE) from None
    except (click.ClickException, click.exceptions.Exit):
        raise  # a usage error found by the body (contradicting options): click's line and exit 2
    except DispatchError as exc:
        report_error(opts, exc)
        raise click.exceptions.Exit(EXIT_INVALID if isinstance(exc, InvalidError) else EXIT_FAILED) from None
    except Exception as exc:  # a bug below us: still one line (no traceback), and a failure exit code
        report_unexpected(opts, exc)
        raise click.exceptions.Exit(EXIT_FAILED) from None
    if code:
        raise click.exceptions.Exit(code)


def report_error(opts: Options, exc: DispatchError) -> None:
    if structured_logs():  # JSON logs are JSON lines only, the last one included
        logging.getLogger("dispatch.cli").error("%s", exc)
    else:
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
    line = f"unexpected {type(exc).__name__}: {message} (this is a dispatch defect; please report it)"
    if structured_logs():
        logging.getLogger("dispatch.cli").error("%s", line)
    else:
        click.echo(f"error: {line}", err=True)
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
@click.version_option(package_name=DISTRIBUTION)
@_common_options
@click.pass_context
def cli(ctx: click.Context, /, **common: Any) -> None:
    """dispatch: submit and supervise training jobs, with typed outcomes.

    The common options (--config, --cluster, -n/--namespace, --context, -o/--json, --no-headers,
    --quiet, --epoch-times, --token-file) may be given before the command or after it.
    """
    ctx.obj = _options(common)


# ---------------------------------------------------------------------- jobs


@cli.command()
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
    await _mark(opts, cluster, rec.job_id)
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


@contextmanager
def settings_refused(cf: ClusterFile) -> Iterator[None]:
    """A cluster's refusal of the config's settings (``settings.queue: ... does not exist; LocalQueues
    that exist: ...``) names the config file, as the file's own errors do."""
    try:
        yield
    except ReadOnlyError:
        raise
    except UnsupportedError as exc:
        if cf.embedded or not any(r.startswith("settings.") for r in exc.reasons):
            raise
        raise UnsupportedError(
            [f"{cf.source}: {r}" if r.startswith("settings.") else r for r in exc.reasons]
        ) from None


@contextmanager
def refused_job(jobfile: str) -> Iterator[None]:
    """A cluster's refusal of a job (``UnsupportedError``: a runtime that does not exist, a queue...)
    names the job file, as the file's own errors do; the reasons name the path in it and the
    alternatives."""
    try:
        yield
    except ReadOnlyError:
        raise
    except UnsupportedError as exc:
        raise UnsupportedError([f"{jobfile}: {r}" for r in exc.reasons]) from None


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
    type=click.Choice(UNMATCHED),
    default=UNMATCHED[0],
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
    "--ui-address",
    metavar="HOST:PORT",
    help="Also serve the read-only page of every job (as `dispatch ui`) at http://HOST:PORT/.",
)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default=None,
    help="Write structured logs to stderr: one JSON object per line, or text.",
)
@action()
async def supervise(
    opts: Options,
    lease: float,
    poll: float,
    resync: float,
    unmatched: str,
    holder: str | None,
    once: bool,
    metrics_address: str | None,
    log_format: str | None,
    ui_address: str | None,
) -> int:
    """Run the supervisor: apply the recovery policy to every job of the store until SIGTERM/SIGINT.

    On SIGTERM or SIGINT it finishes the step in hand, releases its leases and exits 0. Several
    supervisors may run over one store; they split the jobs by lease."""
    import signal

    from dispatch import health, metrics
    from dispatch.logs import configure
    from dispatch.ui.app import parse_address

    out = opts.out
    if log_format is not None:
        configure(log_format)
    if metrics_address is not None:
        metrics.enable(metrics_address, daemon="supervisor")
    if ui_address is not None:
        parse_address(ui_address, "--ui-address")  # refused before anything opens
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
                cf = opts.cluster_file()
                cluster = await opts.open(start_dev=first)
            except (InvalidError, UnsupportedError):
                raise  # the configuration itself is wrong: retrying cannot help
            except DispatchError as exc:
                if once:
                    raise
                delay = health.reconnect_delay(attempt)
                attempt += 1
                first = False
                health.current().block(f"cannot open the cluster: {exc}")
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
                opts, cluster, cf, stop, lease, poll, resync, unmatched, holder, once, ui_address, log_format
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
    ui_address: str | None,
    log_format: str | None,
) -> int | None:
    """Supervise on one opened cluster until told to stop (the exit code) or until the cluster stops
    answering (``None``: the caller reconnects)."""
    from dispatch import health, metrics
    from dispatch.cli.ui import serving

    out = opts.out
    async with cluster, serving(opts, cluster, ui_address, option="--ui-address") as page:
        # Records of a stopped dev cluster are not this cluster's to recover: left as last known.
        gone = await _gone(opts, cluster, await cluster.records())
        sup = cluster.supervisor(
            poll=poll, lease=lease, resync=resync, unmatched=unmatched, holder=holder, exclude=gone
        )
        # --log-format json: what the daemon says is JSON lines too, never a plain line.
        say = out.json if out.as_json or log_format == "json" else None
        port = metrics.served_port()
        if say is not None:
            say(
                {"supervisor": sup.holder, "adapter": cf.adapter, "store": str(cf.store), "event": "started"}
                | ({"metricsPort": port} if port is not None else {})
                | ({"page": page} if page is not None else {})
            )
        else:
            served = f"; metrics on port {port}" if port is not None else ""
            served += f"; the page at {page}" if page is not None else ""
            out.line(f"supervisor {sup.holder} on {cf.adapter} ({cf.store}): started{served}")
        if gone:
            if say is not None:
                say({"supervisor": sup.holder, "event": "left-alone", "jobs": sorted(gone)})
            else:
                out.line(left_alone(gone))

        said: dict[str, str] = {}  # job -> the last action line shown for it

        failed: list[str] = []  # what went wrong in a --once step: the exit code says so
        failing = 0  # steps in a row with errors
        lost = False

        async def report(r: StepReport) -> None:
            nonlocal failing
            failed.extend(r.errors)
            failing = failing + 1 if r.errors else 0
            if r.errors:
                health.current().block(f"the last step failed: {r.errors[0]}")
            else:
                health.current().unblock()
            for a in r.actions:
                if say is not None:
                    say({"supervisor": sup.holder, "action": a})
                elif said.get(a.split(":", 1)[0]) != a:  # one repeated step after step is said once
                    said[a.split(":", 1)[0]] = a
                    out.line(f"{when(cluster.clock.now())}  {a}")
            for e in r.errors:
                if say is not None:
                    say({"supervisor": sup.holder, "error": e})
                else:
                    out.line(f"{when(cluster.clock.now())}  error: {e}", style="red")
            for u in r.unreadable:  # named once; the others are supervised regardless
                if say is not None:
                    say({"supervisor": sup.holder, "skipped": u})
                else:
                    out.line(f"{when(cluster.clock.now())}  skipped: {u}", style="yellow")

        async def done() -> bool:
            nonlocal lost
            if once:
                return True
            if failing >= UNREACHABLE_STEPS:
                try:  # failing steps: is the cluster still there? (a restarted one may have moved)
                    await cluster.backend.capabilities()
                    await cluster.backend.list()
                except DispatchError as exc:
                    health.current().block(f"lost the cluster: {exc}")
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


def left_alone(gone: Mapping[str, str]) -> str:
    """The supervisor's note on the jobs of a dev cluster that is gone: every one of them, by name."""
    dead = sorted(j for j, why in gone.items() if why.startswith("gone: "))
    other = sorted(j for j in gone if j not in dead)
    parts = [f"{len(dead)} job(s) of a dev cluster that is gone ({', '.join(dead)})"] if dead else []
    parts += [f"{len(other)} job(s) of another cluster ({', '.join(other)})"] if other else []
    return "left alone: " + "; ".join(parts)


@cli.command()
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


@cli.command()
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
    await _mark(opts, cluster, rec.job_id)
    out.summary(rec, "submitted")
    return EXIT_OK


@cli.command()
@click.argument("job", shell_complete=complete_job)
@action(READ)
async def status(opts: Options, cluster: Cluster, job: str) -> int:
    """Show the record of JOB, refreshed from the cluster (read-only: no probe, no write)."""
    rec, gone = await _current(opts, cluster, job)
    opts.out.record(rec, gone=gone)
    return EXIT_OK


async def _current(opts: Options, cluster: Cluster, job: str) -> tuple[JobRecord, str | None]:
    """The job's record refreshed from the cluster; as last known (and why) when its cluster is gone."""
    rec = await cluster.record(job)
    gone = await _gone(opts, cluster, [rec])
    if job in gone:
        return rec, gone[job]
    if isinstance(cluster.backend, OfflineBackend):
        return rec, None
    return await cluster.get(job), None


async def _mark(opts: Options, cluster: Cluster, job_id: str) -> None:
    """On the embedded default, remember which dev cluster instance runs the job."""
    if opts.cluster_file().embedded:
        dev = devcluster.running()
        if dev is not None:
            await mark(cluster, job_id, dev)


async def _refuse_gone_offline(opts: Options, job: str) -> None:
    """Before a write command starts the dev cluster: refuse at once if the job's cluster is gone."""
    if not opts.cluster_file().embedded or devcluster.running() is not None:
        return
    async with opts.offline() as cluster:
        gone = await gone_jobs(cluster, [await cluster.record(job)], None)
    if job in gone:
        raise ConflictError(f"job {job!r}: {gone[job]}")


async def _gone(opts: Options, cluster: Cluster, records: list[JobRecord]) -> Mapping[str, str]:
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


@cli.command("list")
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
    """List every job, refreshed from the cluster (read-only: no probe, no write)."""
    from dispatch.cli.selectors import matches, parse_selector

    wanted = [State(s) for s in states] or None
    requirements = parse_selector(selector) if selector else []
    stored = await cluster.records()
    gone = await _gone(opts, cluster, stored)
    if isinstance(cluster.backend, OfflineBackend):  # no cluster to ask: the records as last known
        records = [r for r in stored if wanted is None or r.state in wanted]
    elif not gone:
        records = await cluster.list(wanted)
    else:  # refresh the others one by one; the gone ones stay as last known
        records = [
            r if r.job_id in gone or r.outcome.terminal else await cluster.get(r.job_id) for r in stored
        ]
        records = [r for r in records if wanted is None or r.state in wanted]
    records = [r for r in records if matches(r, requirements)]
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
        if (wanted is None or rec.state in wanted) and matches(rec, requirements):
            out.records([rec], gone=gone)
    return EXIT_OK


@cli.command()
@click.argument("job", required=False, shell_complete=complete_job)
@action(READ)
async def watch(opts: Options, cluster: Cluster, job: str | None) -> int:
    """Print records as they change: one job until it ends, or every job until interrupted.

    With JOB the exit code is its outcome's: 0 only when it succeeded."""
    out = opts.out
    if job is not None:
        rec, gone = await _current(opts, cluster, job)
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


@cli.command()
@click.argument("job", shell_complete=complete_job)
@action(WRITE, job="job")
async def cancel(opts: Options, cluster: Cluster, job: str) -> int:
    """Cancel JOB. A job that already ended is left as it is (exit code 3)."""
    await _refuse_gone(opts, cluster, job, "cancel")
    before = await cluster.get(job)
    if before.outcome.terminal:
        return _already_ended(opts, before, "cancel")
    opts.out.summary(await cluster.cancel(job), "cancel")
    return EXIT_OK


@cli.command()
@click.argument("jobs", nargs=-1, shell_complete=complete_job)
@click.option(
    "--cluster-gone",
    is_flag=True,
    help="Every unfinished job of a dev cluster that is gone (the embedded default's).",
)
@click.option("--reason", metavar="TEXT", help="Why, for the history (default: its cluster is gone).")
@action(READ)
async def forget(
    opts: Options, cluster: Cluster, jobs: tuple[str, ...], cluster_gone: bool, reason: str | None
) -> int:
    """End JOBS, whose cluster is gone: each is recorded lost (the user as actor, the reason in its
    history) and never requeued. Nothing is asked of any cluster; a job of this cluster is refused
    (cancel it instead), a finished one is left as it is."""
    if not jobs and not cluster_gone:
        raise click.UsageError("name the jobs to forget, or --cluster-gone")
    todo = list(jobs)
    if cluster_gone:
        if not opts.cluster_file().embedded:
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


@cli.command()
@click.option(
    "--older-than",
    required=True,
    metavar="DURATION",
    help="Finished jobs last changed longer ago than this (30m, 24h, 168h).",
)
@action(READ)
async def purge(opts: Options, cluster: Cluster, older_than: str) -> int:
    """Delete finished jobs' records (and their histories) last changed longer ago than --older-than.
    Unfinished jobs are never deleted; nothing is asked of any cluster."""
    import time

    seconds = parse_duration(older_than, "--older-than")
    count = await cluster.purge(time.time() - seconds)
    opts.out.line(f"purged {count} finished job(s) last changed more than {older_than} ago")
    return EXIT_OK


def _already_ended(opts: Options, rec: JobRecord, what: str) -> int:
    """A write that has nothing to act on: the job already ended. Said on stderr, with its outcome."""
    click.echo(f"error: cannot {what} {rec.job_id}@{rec.epoch}: it already ended {rec.outcome}", err=True)
    if opts.as_json:
        opts.out.json({"error": {"type": "AlreadyEnded", "message": f"already ended {rec.outcome}"}})
    return EXIT_ALREADY_ENDED


@cli.command()
@click.argument("job", shell_complete=complete_job)
@action(WRITE, job="job")
async def hold(opts: Options, cluster: Cluster, job: str) -> int:
    """Hold JOB (keep it from running) until released."""
    await _refuse_gone(opts, cluster, job, "hold")
    if opts.cluster_file().read_only:
        raise ReadOnlyError(
            f"cannot hold {job}: {opts.cluster_file().source} says readOnly: true, so dispatch sends "
            "this cluster no write (a hold changes the job's object); use a config without it"
        )
    opts.out.summary(await cluster.hold(job), "hold")
    return EXIT_OK


@cli.command()
@click.argument("job", shell_complete=complete_job)
@action(WRITE, job="job")
async def release(opts: Options, cluster: Cluster, job: str) -> int:
    """Release the hold on JOB."""
    await _refuse_gone(opts, cluster, job, "release")
    opts.out.summary(await cluster.release(job), "release")
    return EXIT_OK


async def _refuse_gone(opts: Options, cluster: Cluster, job: str, what: str) -> None:
    gone = await _gone(opts, cluster, [await cluster.record(job)])
    if job in gone:
        raise ConflictError(f"cannot {what} job {job!r}: {gone[job]}")


@cli.command()
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
    opts: Options, cluster: Cluster, job: str, jobfile: str | None, spec: JobSpec | None, wait: float
) -> int:
    """Start a new incarnation of finished JOB (with JOBFILE's spec, if given), once the previous
    incarnation's compute is gone."""
    await _refuse_gone(opts, cluster, job, "resubmit")
    rec = await cluster.resubmit(job, spec, wait=wait)
    await _mark(opts, cluster, rec.job_id)
    opts.out.summary(rec, "resubmitted")
    return EXIT_OK


@cli.command()
@click.argument("job", shell_complete=complete_job)
@action(READ)
async def history(opts: Options, cluster: Cluster, job: str) -> int:
    """Show the transitions of JOB, oldest first, then every incarnation and why it ended.

    The record is refreshed first (read-only), so the last lines say where the job is now."""
    await _current(opts, cluster, job)
    opts.out.transitions(job, await cluster.history(job), incarnations=True)
    return EXIT_OK


@cli.command("describe")
@click.argument("job", shell_complete=complete_job)
@action(READ)
async def describe_(opts: Options, cluster: Cluster, job: str) -> int:
    """Show JOB whole: its record and spec, every incarnation as a timeline (states, causes, evidence,
    the rule of each requeue), its cluster objects, and the next steps a person could take."""
    rec, gone = await _current(opts, cluster, job)
    steps = [s for s in next_steps(rec) if "dispatch describe" not in s]
    opts.out.describe(rec, await cluster.history(job), steps, gone=gone)
    return EXIT_OK


@cli.command()
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
    "--epoch", "epoch_n", type=click.IntRange(min=1), help="Incarnation N (default: the current one)."
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
    epoch_n: int | None,
    since: str | None,
    timestamps: bool,
) -> int:
    """Print the output of JOB's nodes: every node at once, each line prefixed with its node, or one."""
    seconds = parse_duration(since, "--since") if since is not None else None
    rec, gone = await _current(opts, cluster, job)
    if gone:
        raise ConflictError(f"cannot read the output of {job}: {gone}")
    nodes = rec.spec.nodes
    if node is not None and node >= nodes:
        raise InvalidError(
            f"node {node} does not exist: {job} has {nodes} node(s), 0 to {nodes - 1}", path="--node"
        )
    if epoch_n is not None and epoch_n != rec.epoch.n:
        raise NotFoundError(earlier_output(rec, epoch_n))
    why = nothing_yet(rec, follow=follow)
    if why is not None:
        opts.say(why)
        if not follow or rec.state is State.HELD:
            return EXIT_OK
    out = opts.out
    chosen = [node] if node is not None else list(range(nodes))
    prefix = node is None and nodes > 1

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
        except BusyError as exc:
            if previous:  # not "retry later": there is no earlier run to wait for
                raise NotFoundError(
                    f"node {n} of {job}@{rec.epoch} has no earlier run: it has not restarted in place"
                ) from None
            raise exc

    if follow and len(chosen) > 1:  # every node's lines as they come
        try:
            async with asyncio.TaskGroup() as group:
                readers.extend(group.create_task(read(n)) for n in chosen)
        except BaseExceptionGroup as group_error:  # one node's error is the command's (one line)
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
    return EXIT_OK


_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(text: str, option: str) -> float:
    """kubectl's durations (Go's): numbers with units, ``30s``, ``5m``, ``1h30m``, ``500ms``."""
    import re

    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text)
    if not parts or "".join(n + u for n, u in parts) != text:
        raise InvalidError(f"{text!r}: expected a duration such as 30s, 5m or 1h30m", path=option)
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise InvalidError(f"{text!r}: expected a duration above zero", path=option)
    return seconds


def nothing_yet(rec: JobRecord, *, follow: bool) -> str | None:
    """Why a job has no output to read yet, or ``None`` when it may have some."""
    jid = f"{rec.job_id}@{rec.epoch}"
    if rec.state is State.HELD:
        return f"{jid} is held: its nodes do not run until `dispatch release {rec.job_id}`; nothing to read"
    if rec.state is State.PENDING:
        then = "waiting for them to start" if follow else "`--follow` waits for them to start"
        return f"{jid} is pending (its nodes have not started): nothing to read yet; {then}"
    return None


def earlier_output(rec: JobRecord, n: int) -> str:
    """Why the output of incarnation ``n`` (not the current one) cannot be read."""
    if n > rec.epoch.n:
        return f"{rec.job_id} has no incarnation {n}: the current one is {rec.epoch}"
    return (
        f"the output of {rec.job_id}'s incarnation {n} is gone from the cluster: an incarnation's objects are "
        f"removed before the next one starts (the current one is {rec.epoch}); how it ended, with the last "
        f"lines of a failed node, is in `dispatch describe {rec.job_id}` and `dispatch history {rec.job_id}`"
    )


# ---------------------------------------------------------------------- clusters and adapters


@cli.command()
@click.option("--read-only", is_flag=True, help="Open read-only: no probe, no write (what a dashboard sees).")
@click.option("--refresh", is_flag=True, help="Probe again, ignoring the findings cached in the store.")
@action()
async def check(opts: Options, read_only: bool, refresh: bool) -> int:
    """Open the configured cluster and print its capabilities."""
    if read_only and refresh:
        raise click.UsageError("--refresh probes, --read-only never does: give one of them")
    return await _check(opts, read_only=read_only, refresh=refresh)


@cli.command("open")
@action()
async def open_(opts: Options) -> int:
    """Open the configured cluster and print its capabilities (the same as `check`)."""
    return await _check(opts)


async def _check(opts: Options, *, read_only: bool = False, refresh: bool = False) -> int:
    # Opened here rather than by the decorator: only this command may ask to probe again.
    cf = opts.cluster_file()
    async with await opts.open(read_only=read_only, refresh=refresh) as cluster:
        caps = await cluster.capabilities()
        try:  # the store is opened lazily: read from it, so a store down or refusing us fails here
            await cluster.records()
        except DispatchError as exc:
            raise type(exc)(f"the store {cf.store} cannot be read: {exc}") from None
        opts.out.capabilities(cf.adapter, cf.source, str(cf.store), caps)
    return EXIT_OK


@cli.command()
@click.argument("adapter")
@action()
async def schema(opts: Options, adapter: str) -> int:
    """Print the JSON Schema of ADAPTER's settings."""
    opts.out.mapping(adapter_schema(adapter), yaml_form=False)
    return EXIT_OK


def adapter_schema(name: str) -> dict[str, Any]:
    """The settings schema adapter ``name`` publishes (its descriptor's ``schema``)."""
    return describe_adapter(name).settings_schema()


@cli.command("adapters")
@action()
async def adapters_(opts: Options) -> int:
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
        return EXIT_OK
    out.table(
        ["adapter", "extensions", "what it is"],
        [[a.name, ", ".join(sorted(a.extensions)) or "-", a.summary] for a in found],
    )
    return EXIT_OK


@cli.command()
@action()
async def version(opts: Options) -> int:
    """Print the version of dispatch (and of Python)."""
    import platform
    from importlib.metadata import version as dist_version

    value = dist_version(DISTRIBUTION)
    if opts.as_json:
        opts.out.json({"dispatch": value, "distribution": DISTRIBUTION, "python": platform.python_version()})
    else:
        opts.out.line(f"dispatch {value} ({DISTRIBUTION}; Python {platform.python_version()})")
    return EXIT_OK


cli.add_command(devcluster.command)
from dispatch.cli.ui import command as ui_command  # noqa: E402 - it builds on common and execute above

cli.add_command(ui_command)


def main(argv: list[str] | None = None) -> None:
    """The console script's entry: run the CLI."""
    try:
        cli.main(args=argv if argv is not None else sys.argv[1:], prog_name="dispatch")
    except BrokenPipeError:  # outside a command's body (click's own help or usage output)
        quiet_pipe()
        sys.exit(EXIT_BROKEN_PIPE)
    except Exception as exc:  # outside a command's body (option parsing, a plugin): still one line
        report_unexpected(None, exc)
        sys.exit(EXIT_FAILED)


def quiet_pipe() -> None:
    """The reader went away (`dispatch status JOB | head -1`): the caller stops quietly, as a Unix tool
    killed by SIGPIPE does (exit 141); stdout becomes /dev/null so the flush at exit does not complain."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (a test runner's buffer): nothing to flush at exit
        pass
