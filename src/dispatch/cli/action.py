"""The one way to write a command's body (:func:`action`), and how it ends: errors as one line and an exit
code (:mod:`dispatch.cli.exits`)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sys
from collections.abc import Callable, Coroutine, Mapping
from typing import Any

import click

from dispatch.cli.config import read_token
from dispatch.cli.exits import EXIT_BROKEN_PIPE, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_INVALID
from dispatch.cli.fleetconfig import FleetConfig
from dispatch.cli.jobfile import load_job
from dispatch.cli.options import COMMON, Options, common_options, options_from
from dispatch.cli.standing import refuse_gone_offline
from dispatch.errors import DispatchError, InvalidError, ReadOnlyError, UnsupportedError
from dispatch.logs import SECRETS
from dispatch.logs import structured as structured_logs

__all__ = [
    "READ",
    "WRITE",
    "action",
    "complete_job",
    "execute",
    "quiet_pipe",
    "report_error",
    "report_unexpected",
]

READ = "read"
WRITE = "write"
"""How a command opens the cluster: read-only (no probe, no write request) or for writing."""


Opening = str | None | Callable[[Mapping[str, Any]], str | None]


def action(
    opens: Opening = None, *, job: str | None = None, spec: str | None = None, fleet_clusters: bool = False
) -> Callable[..., Any]:
    """The one way to write a command's body: ``async def body(opts, cluster, **args) -> int | None``.

    The decorator adds the common options (``--config``, ``--token-file``, ``--json``/``-o``,
    ``--no-headers``, ``--quiet``), reads the job file named by argument ``spec`` (passed as ``spec``,
    before anything opens, so a typo is reported first), opens the cluster as ``opens`` says (``READ``,
    ``WRITE``, ``None`` for no cluster — then the body gets no ``cluster`` — or a function of the
    arguments choosing one), and closes it after. ``job``: the argument naming the job a write command
    acts on; when its dev cluster is gone, nothing is started. ``fleet_clusters``: the command reads
    ``--cluster`` in a fleet (:attr:`Options.fleet_clusters`); the others refuse it there. Errors become
    one line and an exit code (:func:`execute`)."""

    def decorate(body: Callable[..., Coroutine[Any, Any, int | None]]) -> Callable[..., None]:
        @common_options
        @functools.wraps(body)
        def command(**kwargs: Any) -> None:
            outer = click.get_current_context().find_root().obj
            opts = options_from(
                {k: kwargs.pop(k) for k in COMMON}, outer if isinstance(outer, Options) else None
            )
            name = click.get_current_context().info_name or body.__name__
            mode = opens(kwargs) if callable(opens) else opens
            execute(opts, _act(opts, name, body, mode, job, spec, kwargs, fleet_clusters))

        return command

    return decorate


async def _act(
    opts: Options,
    name: str,
    body: Callable[..., Coroutine[Any, Any, int | None]],
    mode: str | None,
    job: str | None,
    spec: str | None,
    kwargs: dict[str, Any],
    fleet_clusters: bool = False,
) -> int | None:
    if opts.clusters and not fleet_clusters and isinstance(opts.cluster_file(), FleetConfig):
        raise InvalidError(
            f"{','.join(opts.clusters)}: in a fleet ({opts.cluster_file().source}) --cluster names the "
            "clusters a new job may go to (run, submit, validate) and those list, clusters and supervise look "
            f"at; `{name}` works on the whole fleet, each job on its own cluster",
            path="--cluster",
        )
    if spec is not None:
        kwargs["spec"] = load_job(kwargs[spec]) if kwargs[spec] is not None else None
    if mode is None:
        return await body(opts, **kwargs)
    if mode == WRITE and opts.cluster_file().read_only:
        what = f"{name} {kwargs[job]}" if job is not None else name
        raise ReadOnlyError(
            f"cannot {what}: {opts.cluster_file().source} says readOnly: true, so dispatch sends this "
            "cluster no write; use a config without it"
        )
    if job is not None and mode == WRITE:
        await refuse_gone_offline(opts, kwargs[job])
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


def report_error(opts: Options, exc: DispatchError, *, message: str | None = None, **about: Any) -> None:
    """One line on stderr (``error: ...``), and with ``-o json`` its JSON on stdout; ``message`` in place
    of the error's own, ``about`` beside the error in the JSON (``node`` of ``logs``)."""
    text = str(exc) if message is None else message
    if structured_logs():  # JSON logs are JSON lines only, the last one included
        logging.getLogger("dispatch.cli").error("%s", text)
    else:
        click.echo(f"error: {text}", err=True)
    if opts.as_json:
        body: dict[str, Any] = {"type": type(exc).__name__, "message": text}
        if isinstance(exc, InvalidError) and exc.path:
            body["path"] = exc.path
        if isinstance(exc, UnsupportedError):
            body["reasons"] = list(exc.reasons)
        click.echo(json.dumps({"error": body, **about}, sort_keys=True))


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


def quiet_pipe() -> None:
    """The reader went away (`dispatch status JOB | head -1`): the caller stops quietly, as a Unix tool
    killed by SIGPIPE does (exit 141); stdout becomes /dev/null so the flush at exit does not complain."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # no real stdout (a test runner's buffer): nothing to flush at exit
        pass
