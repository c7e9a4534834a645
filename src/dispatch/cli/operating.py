"""Operating: ``supervise``, the supervisor daemon (reconnecting, reporting, serving metrics and the page)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import click

from dispatch.cli.action import action
from dispatch.cli.config import ClusterFile
from dispatch.cli.exits import EXIT_FAILED, EXIT_OK
from dispatch.cli.options import Options
from dispatch.cli.render import when
from dispatch.cli.standing import last_known
from dispatch.cluster import Cluster
from dispatch.errors import DispatchError, InvalidError, UnsupportedError

if TYPE_CHECKING:  # the supervisor (and its health endpoint's HTTP server) loads only for `supervise`
    from dispatch.supervise import StepReport

__all__ = ["COMMANDS", "UNMATCHED", "left_alone"]

_log = logging.getLogger("dispatch.supervise")

UNMATCHED = ("ignore", "adopt", "delete")
"""``supervise --unmatched``: the values of :class:`dispatch.supervise.UnmatchedPolicy`, default first
(spelt out so that no other command imports the supervisor; a test holds them equal)."""


@click.command()
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
                what = "the store" if await _store_fails(opts) else "the cluster"
                health.current().block(f"cannot open {what}: {exc}")
                said = f"cannot open {what} ({exc}); retrying in {delay:.1f} s"
                if out.as_json:
                    out.json(
                        {"event": "cannot-open", "what": what.removeprefix("the "), "error": str(exc)}
                        | {"retryIn": round(delay, 1)}
                    )
                if log_format is not None:  # the daemon's logs say it, in their form
                    _log.warning("%s", said)
                elif not out.as_json:
                    out.line(f"{when(time.time())}  {said}", style="red")
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


async def _store_fails(opts: Options) -> bool:
    """Whether the store cannot be read (after opening failed): then the store, not the cluster, is what
    to name. A read of the key-value table, else of the records; nothing is written."""
    from dispatch.records import KeyValues

    cf = opts.cluster_file()
    try:
        store = cf.store.open()
    except DispatchError:
        return True
    try:
        if isinstance(store, KeyValues):
            await store.get_value("dispatch/supervise/reachable")
        else:
            await store.list()
    except DispatchError:
        return True
    finally:
        await store.close()
    return False


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
        gone = await last_known(opts, cluster, await cluster.records())
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
        failing = 0  # steps in a row with errors, or after which the cluster did not answer
        lost = False

        async def report(r: StepReport) -> None:
            nonlocal failing
            failed.extend(r.errors)
            down = sup.unreachable  # its reads and its watch (a cache may answer while the watch fails)
            failing = failing + 1 if r.errors or down is not None else 0
            if r.errors:
                health.current().block(f"the last step failed: {r.errors[0]}")
            elif down is not None:
                health.current().block(f"the cluster does not answer since {when(down.at)}: {down.reason}")
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
                # Failing steps: is the cluster still there? (a restarted one may have moved.) A listing
                # the adapter answers from its cache says yes while its watch still retries: a blip
                # rides on it, and the daemon reconnects once the watch gave up.
                try:
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


COMMANDS = (supervise,)
