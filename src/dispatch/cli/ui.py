"""``dispatch ui``: serve the page (every job, each job's incarnations on a timeline) until interrupted.

Read-only: the cluster is opened read-only (no probe, no write) and only read for output tails; the
records come from the store. The page lives in :mod:`dispatch.ui`, imported only when this command runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING

import click

from dispatch.cli import devcluster
from dispatch.cli.action import READ, action
from dispatch.cli.embedded import gone_jobs
from dispatch.cli.exits import EXIT_OK
from dispatch.cli.options import Options
from dispatch.cli.standing import cluster_names
from dispatch.cluster import Cluster
from dispatch.model import JobRecord
from dispatch.ui import DEFAULT_ADDRESS

if TYPE_CHECKING:
    from dispatch.fleet import Fleet
    from dispatch.ui.app import UiServer

__all__ = ["COMMANDS", "command", "no_authentication", "serve_page", "serving"]


def no_authentication(host: str) -> str | None:
    """The warning to print when the page is served beyond loopback, else ``None``."""
    from dispatch.ui.app import is_loopback

    if is_loopback(host):
        return None
    return (
        f"warning: the page is served on {host}, beyond this machine, and has no authentication: "
        "anyone who can reach it sees every job, its spec and its output"
    )


async def serve_page(opts: Options, cluster: Cluster | Fleet, address: str, *, option: str) -> UiServer:
    """Serve the page for ``cluster`` at ``address`` (``option`` names the flag in errors), saying
    where, and that it has no authentication when not on loopback."""
    from dispatch.ui.app import parse_address, serve

    embedded = opts.cluster_file().embedded

    async def notes(records: Sequence[JobRecord]) -> Mapping[str, str]:
        """Jobs of a dev cluster that is gone: shown as last known, saying why (as `status` does)."""
        if not embedded or not isinstance(cluster, Cluster):
            return {}
        gone = await gone_jobs(cluster, records, devcluster.running())
        return {job: f"gone: {why}" for job, why in gone.items()}

    async def names(clusters: Sequence[str]) -> Mapping[str, str]:
        return await cluster_names(opts, cluster, clusters)

    host, _ = parse_address(address, option)
    warning = no_authentication(host)
    if warning is not None:
        opts.say(warning)
    label = str(opts.cluster_file().store)
    return await serve(cluster, address, store_label=label, notes=notes, names=names, path=option)


@contextlib.asynccontextmanager
async def serving(
    opts: Options, cluster: Cluster | Fleet, address: str | None, *, option: str
) -> AsyncIterator[str | None]:
    """While the ``with`` lasts, serve the page at ``address`` (nothing when ``None``); yields its URL."""
    if address is None:
        yield None
        return
    async with await serve_page(opts, cluster, address, option=option) as server:
        yield server.url


@click.command("ui")
@click.option(
    "--address",
    default=DEFAULT_ADDRESS,
    show_default=True,
    metavar="HOST:PORT",
    help="Where to serve the page (port 0 picks a free one). Beyond loopback it has no authentication.",
)
@action(READ)
async def command(opts: Options, cluster: Cluster | Fleet, address: str) -> int:
    """Serve a read-only web page of every job and each job's incarnations on a timeline, live.

    It reads the store (and the cluster, read-only, for output tails) until interrupted."""
    async with serving(opts, cluster, address, option="--address") as url:
        if opts.as_json:
            opts.out.json({"url": url, "event": "serving"})
        else:
            opts.out.line(f"serving the page at {url} (read-only; Ctrl-C stops it)")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
    return EXIT_OK


COMMANDS = (command,)
