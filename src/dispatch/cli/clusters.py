"""The cluster and the adapters: ``check``/``open``, ``clusters``, ``schema``, ``adapters``, ``version``. (The
dev cluster's commands are in :mod:`dispatch.cli.devcluster`.)"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from dispatch.cli.action import READ, action
from dispatch.cli.config import ClusterFile
from dispatch.cli.exits import EXIT_OK
from dispatch.cli.options import Options
from dispatch.cluster import Cluster
from dispatch.errors import DispatchError
from dispatch.registry import describe as describe_adapter
from dispatch.registry import load_installed

if TYPE_CHECKING:
    from dispatch.fleet import Fleet

__all__ = ["COMMANDS", "DISTRIBUTION", "adapter_schema"]

DISTRIBUTION = "dispatch-train"
"""The distribution (package index) name; the import package is ``dispatch``."""


@click.command()
@click.option("--read-only", is_flag=True, help="Open read-only: no probe, no write (what a dashboard sees).")
@click.option("--refresh", is_flag=True, help="Probe again, ignoring the findings cached in the store.")
@action()
async def check(opts: Options, read_only: bool, refresh: bool) -> int:
    """Open the configured cluster and print its capabilities."""
    if read_only and refresh:
        raise click.UsageError("--refresh probes, --read-only never does: give one of them")
    return await _check(opts, read_only=read_only, refresh=refresh)


@click.command("open")
@action()
async def open_(opts: Options) -> int:
    """Open the configured cluster and print its capabilities (the same as `check`)."""
    return await _check(opts)


async def _check(opts: Options, *, read_only: bool = False, refresh: bool = False) -> int:
    # Opened here rather than by the decorator: only this command may ask to probe again.
    cf = opts.cluster_file()
    async with await opts.open(read_only=read_only, refresh=refresh) as cluster:
        try:  # the store is opened lazily: read from it, so a store down or refusing us fails here
            await cluster.records()
        except DispatchError as exc:
            raise type(exc)(f"the store {cf.store} cannot be read: {exc}") from None
        if not isinstance(cluster, Cluster) or not isinstance(cf, ClusterFile):
            return await _roll(opts, cluster)  # a fleet: each of its clusters
        caps = await cluster.capabilities()
        opts.out.capabilities(cf.adapter, cf.source, str(cf.store), caps)
    return EXIT_OK


@click.command("clusters")
@action(READ, fleet_clusters=True)
async def clusters_(opts: Options, cluster: Cluster | Fleet) -> int:
    """List the configured clusters: each one's name, adapter and identity, whether it answers (since when
    not, and why), its capabilities, its checkpoints and how many jobs are on it.

    In a fleet every cluster (--cluster: those named); else the one configured."""
    return await _roll(opts, cluster)


async def _roll(opts: Options, cluster: Cluster | Fleet) -> int:
    """The rows of ``dispatch clusters`` (and of ``check`` on a fleet): people's table, or JSON."""
    from dispatch.cli.roll import roll

    rows = await roll(opts, cluster)
    out = opts.out
    if out.as_json:
        out.json([r.to_json() for r in rows])
    elif out.output == "name":
        out.names(r.name for r in rows)
    else:
        out.table(
            ["cluster", "adapter", "identity", "reachable", "checkpoints", "jobs", "capabilities"],
            [r.cells() for r in rows],
            styles=["" if r.down is None else "red" for r in rows],
        )
    return EXIT_OK


@click.command()
@click.argument("adapter")
@action()
async def schema(opts: Options, adapter: str) -> int:
    """Print the JSON Schema of ADAPTER's settings."""
    opts.out.mapping(adapter_schema(adapter), yaml_form=False)
    return EXIT_OK


def adapter_schema(name: str) -> dict[str, Any]:
    """The settings schema adapter ``name`` publishes (its descriptor's ``schema``)."""
    return describe_adapter(name).settings_schema()


@click.command("adapters")
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


@click.command()
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


COMMANDS = (check, open_, clusters_, schema, adapters_, version)
