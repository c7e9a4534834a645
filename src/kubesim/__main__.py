"""``python -m kubesim serve``: run a simulated cluster on loopback until interrupted.

Writes a kubeconfig (context ``kubesim``, the admin identity's token) so kubectl, lightkube or the
Kubernetes SDK can use it:

    python -m kubesim serve --kubeconfig /tmp/kubesim.yaml &
    kubectl --kubeconfig /tmp/kubesim.yaml get trainjobs -w
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import TextIO

from kubesim.auth import READONLY
from kubesim.clock import RealClock
from kubesim.controllers.processes import ProcessMode
from kubesim.kubeconfig import claim_kubeconfig
from kubesim.requestlog import RequestRecord
from kubesim.sim import Simulator

DEFAULT_KUBECONFIG = "kubesim.kubeconfig"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m kubesim", description="kubesim: a simulated Kubernetes cluster"
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve", help="run the simulator until SIGINT/SIGTERM and write a kubeconfig")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (loopback only by default)")
    s.add_argument("--port", type=int, default=0, help="port (default: an ephemeral port)")
    s.add_argument(
        "--kubeconfig",
        default=DEFAULT_KUBECONFIG,
        help=f"where to write the kubeconfig (default: ./{DEFAULT_KUBECONFIG})",
    )
    s.add_argument("--speed", type=float, default=1.0, help="simulated seconds per real second (default 1)")
    s.add_argument(
        "--tls",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="serve HTTPS with a self-signed certificate (default; kubectl sends tokens only over TLS)",
    )
    s.add_argument("--no-kueue", dest="kueue", action="store_false", help="run without the Kueue simulation")
    s.add_argument(
        "--nodes", type=int, default=None, help="number of simulated nodes (default: the fixtures')"
    )
    s.add_argument("--bookmark-interval", type=float, default=10.0, help="seconds between watch bookmarks")
    s.add_argument(
        "--recreate-jobset-while-deleting",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="Trainer v2.3.0 (the default): re-apply a TrainJob's JobSet while it is deleted in the foreground "
        "(never finishes)",
    )
    s.add_argument(
        "--node-recovery",
        choices=("reboot", "replace"),
        default=None,
        help="what a lost node's machine does later: reboot (comes back) or replace (an autoscaler's new node)",
    )
    s.add_argument(
        "--node-recovery-after",
        type=float,
        default=60.0,
        help="simulated seconds from losing a node to its recovery (default 60)",
    )
    s.add_argument(
        "--event-ttl",
        type=float,
        default=3600.0,
        help="seconds an Event lives after its last write (default 1 h)",
    )
    s.add_argument(
        "--readonly-kubeconfig",
        default=None,
        metavar="PATH",
        help="also write a kubeconfig for the read-only identity (get/list/watch only) to PATH",
    )
    s.add_argument(
        "--no-controllers",
        dest="controllers",
        action="store_false",
        help="an API server only: CRD defaulting, schema and CEL validation; no controllers, fixtures or nodes",
    )
    s.add_argument(
        "--processes",
        action="store_true",
        help="run each pod's command as a local process (pods with a behaviour script keep running it)",
    )
    s.add_argument(
        "--processes-workdir",
        default=".",
        metavar="DIR",
        help="with --processes: the directory the pods' processes run in (default: the current one)",
    )
    s.add_argument(
        "--volumes-dir",
        default=None,
        metavar="DIR",
        help="with --processes: where volumes keep their files (default: kubesim-volumes beside the kubeconfig)",
    )
    s.add_argument(
        "--request-log",
        default=None,
        metavar="FILE",
        help="append one JSON line per request to FILE (time, identity, user agent, verb, path, status, bytes)",
    )
    return p


def _open_request_log(path: str | None) -> tuple[TextIO | None, str]:
    """The request log, opened for appending one line at a time (so ``tail -f`` sees each request)."""
    if not path:
        return None, ""
    p = Path(path).resolve()
    return p.open("a", buffering=1, encoding="utf-8"), str(p)


async def serve(args: argparse.Namespace, *, ready: asyncio.Event | None = None) -> None:
    """Start the simulator, write the kubeconfig, and wait for SIGINT/SIGTERM (or cancellation)."""
    if args.speed <= 0:
        raise SystemExit(f"--speed must be > 0, got {args.speed}")
    claimed = claim_kubeconfig(Path(args.kubeconfig))  # noqa: F841 - held until serve returns
    processes = None
    if getattr(args, "processes", False):
        volumes = args.volumes_dir or os.path.join(os.path.dirname(args.kubeconfig) or ".", "kubesim-volumes")
        processes = ProcessMode.at(args.processes_workdir, volumes)
    sim = Simulator(
        clock=RealClock(args.speed),
        controllers=None if getattr(args, "controllers", True) else [],
        kueue=args.kueue,
        nodes=args.nodes,
        tls=args.tls,
        host=args.host,
        port=args.port,
        bookmark_interval=args.bookmark_interval,
        event_ttl=getattr(args, "event_ttl", 3600.0),
        recreate_jobset_while_deleting=getattr(args, "recreate_jobset_while_deleting", True),
        node_recovery=getattr(args, "node_recovery", None),
        node_recovery_after=getattr(args, "node_recovery_after", 60.0),
        processes=processes,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    log_file, log_path = _open_request_log(getattr(args, "request_log", None))
    if log_file is not None:
        sink = log_file

        def write(rec: RequestRecord) -> None:
            sink.write(rec.as_json_line() + "\n")

        sim.requests.add_sink(write)
    try:
        async with sim:
            path = sim.write_kubeconfig(Path(args.kubeconfig))
            mode = "kueue " + ("on" if args.kueue else "off")
            if processes is not None:
                mode += f", processes in {processes.workdir}, volumes in {processes.volumes}"
            if not getattr(args, "controllers", True):
                mode = "API server only, no controllers"
            print(f"kubesim serving {sim.url} (speed x{args.speed:g}, {mode})", flush=True)
            print(f"kubeconfig written to {path.resolve()}", flush=True)
            print(f"  export KUBECONFIG={path.resolve()}", flush=True)
            if getattr(args, "readonly_kubeconfig", None):
                ro = sim.write_kubeconfig(Path(args.readonly_kubeconfig), token=READONLY)
                print(f"read-only kubeconfig written to {ro.resolve()}", flush=True)
            if log_file is not None:
                print(f"request log: {log_path}", flush=True)
            if not args.tls:
                print("note: plain HTTP; kubectl will not send the token (use TLS for kubectl)", flush=True)
            if ready is not None:
                ready.set()
            await stop.wait()
            print("kubesim: stopping", flush=True)
    finally:
        if log_file is not None:
            log_file.close()


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve":
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(args))
        return 0
    return 2  # pragma: no cover - argparse enforces the subcommand


if __name__ == "__main__":
    sys.exit(main())
