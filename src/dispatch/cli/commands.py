"""The ``dispatch`` command group: every command, gathered from the modules of its kind. See ``docs/cli.md``.

A command is written once, in the module of what it does — :mod:`~dispatch.cli.running` (submitting and
running), :mod:`~dispatch.cli.reading` (reading jobs), :mod:`~dispatch.cli.acting` (acting on jobs and
their records), :mod:`~dispatch.cli.clusters` (the cluster and the adapters), :mod:`~dispatch.cli.operating`
(the supervisor daemon), :mod:`~dispatch.cli.ui` (the page), :mod:`~dispatch.cli.devcluster` (the dev
cluster) — as ``@click.command()`` over ``@action(...)`` (:mod:`dispatch.cli.action`), and listed in that
module's ``COMMANDS``; this module adds them to the group.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from dispatch.cli import acting, clusters, devcluster, operating, reading, running, ui
from dispatch.cli.action import quiet_pipe, report_unexpected
from dispatch.cli.clusters import DISTRIBUTION
from dispatch.cli.exits import EXIT_BROKEN_PIPE, EXIT_FAILED
from dispatch.cli.options import common_options, options_from

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name=DISTRIBUTION)
@common_options
@click.pass_context
def cli(ctx: click.Context, /, **common: Any) -> None:
    """dispatch: submit and supervise training jobs, with typed outcomes.

    The common options (--config, --cluster, -n/--namespace, --context, -o/--json, --no-headers,
    --quiet, --epoch-times, --token-file) may be given before the command or after it.
    """
    ctx.obj = options_from(common)


for _module in (running, reading, acting, clusters, operating, ui):
    for _command in _module.COMMANDS:
        cli.add_command(_command)
cli.add_command(devcluster.command)


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
