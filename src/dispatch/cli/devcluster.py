"""The dev cluster: a kubesim kept running in the background, shared by the commands of a session.

``dispatch dev-cluster start`` runs ``python -m kubesim serve`` as a detached process (real clock, sped
up) and writes, in ``<state dir>/dev-cluster/``:

- ``kubeconfig`` (the admin identity) and ``kubeconfig-readonly`` (get/list/watch only), for kubectl,
  the Kubeflow SDK or any Kubernetes client;
- ``cluster.yaml``, a cluster config for dispatch that points at it (``--config``);
- ``state.json`` (pid, url, instance id, start time, mode), ``kubesim.log`` (its output);
- ``volumes/``, in the processes mode (``start --processes``: pods run their real commands), the volumes'
  files, among them the checkpoint claim's (every dev cluster has the claim ``dispatch-checkpoints``, so
  ``dispatch/SharedCheckpoint`` works on the embedded default).

With no config at all the CLI uses this cluster (the embedded default, SPEC §11): a command that needs
the cluster starts it when it is not running, and says so. dispatch never imports kubesim (SPEC §1):
the cluster is a separate process, which is also what lets it outlive a command.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
from msgspec import Struct

from dispatch.cli.config import DEFAULT_DOCUMENT, dev_dir
from dispatch.errors import ConflictError, UnavailableError

__all__ = [
    "DEFAULT_SPEED",
    "DevCluster",
    "cluster_config_text",
    "dev_dir",
    "running",
    "start",
    "stop",
]

DEFAULT_SPEED = 5.0
"""Simulated seconds per real second: the scripted jobs of the examples finish in about a second."""

NODE_RECOVERY = ("replace", 360.0)
"""What a lost node's machine does on the dev cluster, and after how many simulated seconds: an
autoscaler replaces it (``kubesim serve --node-recovery``), so ``node-lost`` runs never use the cluster up.
Six minutes: after the taint manager evicted its pods (300 s ``tolerationSeconds``), as on a cluster
(a real autoscaler waits longer still), so a job sees its pods evicted before they vanish."""

TRAINER_RECREATES_JOBSET = True
"""Whether the dev cluster's Trainer re-applies a JobSet while its TrainJob is deleted in the foreground,
as Trainer v2.3.0 does (``kubesim serve --recreate-jobset-while-deleting``). On: ``stop`` converges on it
(it suspends, then deletes in the background)."""

CHECKPOINT_VOLUME: dict[str, str] = dict(DEFAULT_DOCUMENT["settings"]["checkpointVolume"])  # type: ignore[index]
"""The PersistentVolumeClaim every dev cluster holds for ``dispatch/SharedCheckpoint``, as the embedded
default's ``checkpointVolume`` names it (``claimName``, ``mountPath``): a job file's checkpoint dir lives
under its mount path."""

START_TIMEOUT = 30.0
"""How long ``start`` waits for kubesim to serve and write its kubeconfig."""

_SERVING = r"kubesim serving (\S+)"


class DevCluster(Struct, frozen=True):
    """A running dev cluster, as its ``state.json`` describes it."""

    pid: int
    url: str
    instance: str
    started_at: float
    speed: float
    directory: Path
    workdir: str = ""
    """The processes mode's working directory: pods run their real commands there; "" when they run
    behaviour scripts only."""

    @property
    def processes(self) -> bool:
        return bool(self.workdir)

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig"

    @property
    def readonly_kubeconfig(self) -> Path:
        return self.directory / "kubeconfig-readonly"

    @property
    def config(self) -> Path:
        return self.directory / "cluster.yaml"

    @property
    def log(self) -> Path:
        return self.directory / "kubesim.log"

    def to_json(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "url": self.url,
            "instance": self.instance,
            "startedAt": self.started_at,
            "speed": self.speed,
            "processes": self.processes,
            "workdir": self.workdir or None,
            "directory": str(self.directory),
            "kubeconfig": str(self.kubeconfig),
            "readonlyKubeconfig": str(self.readonly_kubeconfig)
            if self.readonly_kubeconfig.exists()
            else None,
            "config": str(self.config),
        }


def unready_nodes(found: DevCluster, *, timeout: float = 5.0) -> list[str]:
    """The dev cluster's nodes that are not Ready, as ``name (status: message)``, read with the read-only
    kubeconfig over plain HTTPS (dispatch imports no Kubernetes client here). Raises ``OSError`` or
    ``ValueError`` when they cannot be read."""
    # Imported here: every command asks whether the dev cluster runs; only this asks it over HTTP.
    nodes = _api(found.readonly_kubeconfig, "GET", "/api/v1/nodes", timeout=timeout)["items"]
    out = []
    for node in nodes:
        ready = [c for c in node.get("status", {}).get("conditions") or [] if c.get("type") == "Ready"]
        if not ready or ready[0].get("status") != "True":
            c = ready[0] if ready else {"status": "Unknown", "message": "no Ready condition"}
            out.append(f"{node['metadata']['name']} ({c.get('status')}: {c.get('message', '')})")
    return out


def _api(kubeconfig: Path, method: str, path: str, body: object = None, *, timeout: float = 5.0) -> Any:
    """One request to the dev cluster with a kubeconfig it wrote, over plain HTTPS (dispatch imports no
    Kubernetes client here): the decoded answer. Raises ``OSError`` (``HTTPError`` for an error status)
    or ``ValueError``."""
    # Imported here: every command asks whether the dev cluster runs; only these ask it over HTTP.
    import urllib.request

    import yaml

    cfg = yaml.safe_load(kubeconfig.read_text())
    cluster = cfg["clusters"][0]["cluster"]
    token = cfg["users"][0]["user"]["token"]
    ctx = ssl.create_default_context()
    if cluster.get("certificate-authority-data"):
        ctx = ssl.create_default_context(
            cadata=base64.b64decode(cluster["certificate-authority-data"]).decode()
        )
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{cluster['server']}{path}", data=data, headers=headers, method=method)
    with urllib.request.urlopen(request, timeout=timeout, context=ctx) as resp:
        return json.loads(resp.read())


def _create_checkpoint_claim(kubeconfig: Path) -> None:
    """The claim behind the embedded default's ``checkpointVolume`` (kubesim provisions it at once)."""
    import urllib.error

    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": CHECKPOINT_VOLUME["claimName"], "namespace": "default"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}},
    }
    try:
        _api(kubeconfig, "POST", "/api/v1/namespaces/default/persistentvolumeclaims", claim)
    except urllib.error.HTTPError as exc:
        if exc.code != 409:  # already there: a claim is kept with the cluster
            raise


def cluster_config_text() -> str:
    """The ``cluster.yaml`` written beside the kubeconfig (relative paths resolve from the file)."""
    return (
        "# Written by `dispatch dev-cluster start`: the Kubeflow adapter on this machine's dev cluster.\n"
        "#   dispatch --config <this file> check\n"
        "adapter: kubeflow\n"
        "settings:\n"
        "  kubeconfig: kubeconfig\n"
        "  namespace: default\n"
        f"  checkpointVolume: {json.dumps(CHECKPOINT_VOLUME)}\n"
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (our own child that exited) still answers kill(0): look at its state where we can.
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":
            return False
    return True


def running(directory: Path | None = None) -> DevCluster | None:
    """The dev cluster recorded in ``directory`` if its process is alive, else ``None``."""
    d = directory or dev_dir()
    try:
        raw = json.loads((d / "state.json").read_text())
        found = DevCluster(
            int(raw["pid"]),
            str(raw["url"]),
            str(raw["instance"]),
            float(raw["startedAt"]),
            float(raw["speed"]),
            d,
            str(raw.get("workdir") or ""),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not _alive(found.pid) or not found.kubeconfig.exists():
        return None
    return found


@contextlib.contextmanager
def _locked(d: Path) -> Iterator[None]:
    """One start or stop at a time per directory (two commands racing would start two clusters)."""
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def start(
    *,
    speed: float = DEFAULT_SPEED,
    request_log: str | None = None,
    directory: Path | None = None,
    workdir: Path | None = None,
) -> tuple[DevCluster, bool]:
    """Start the dev cluster unless it runs; returns it and whether this call started it. With
    ``workdir``, in the processes mode: pods without a behaviour script run their real commands there."""
    d = directory or dev_dir()
    with _locked(d):
        found = running(d)
        if found is not None:
            return found, False
        return _spawn(d, speed, request_log, workdir), True


def _spawn(d: Path, speed: float, request_log: str | None, workdir: Path | None) -> DevCluster:
    if speed <= 0:
        raise ConflictError(f"the speed must be > 0, got {speed:g}")
    for stale in ("state.json", "kubeconfig", "kubeconfig-readonly"):
        with contextlib.suppress(FileNotFoundError):
            (d / stale).unlink()
    argv = [
        sys.executable,
        "-m",
        "kubesim",
        "serve",
        "--kubeconfig",
        str(d / "kubeconfig"),
        "--readonly-kubeconfig",
        str(d / "kubeconfig-readonly"),
        "--speed",
        f"{speed:g}",
    ]
    if request_log:
        argv += ["--request-log", str(Path(request_log).resolve())]
    argv += ["--node-recovery", NODE_RECOVERY[0], "--node-recovery-after", f"{NODE_RECOVERY[1]:g}"]
    if TRAINER_RECREATES_JOBSET:
        argv.append("--recreate-jobset-while-deleting")
    if workdir is not None:
        workdir = workdir.resolve()
        argv += ["--processes", "--processes-workdir", str(workdir), "--volumes-dir", str(d / "volumes")]
    log_path = d / "kubesim.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in the terminal that started it does not stop it
            close_fds=True,
        )
    url = _wait_serving(proc, log_path, d / "kubeconfig")
    if url is None:
        text = log_path.read_text(errors="replace")
        raise UnavailableError(
            f"the dev cluster did not start (python -m kubesim serve exited {proc.returncode}); "
            f"its output is in {log_path}:\n{text[-2000:]}"
        )
    import secrets  # deferred: only starting a dev cluster needs it (read commands start fast)

    found = DevCluster(proc.pid, url, secrets.token_hex(8), time.time(), speed, d, str(workdir or ""))
    try:
        _create_checkpoint_claim(found.kubeconfig)
    except (OSError, ValueError) as exc:
        proc.terminate()
        raise UnavailableError(f"the dev cluster did not take its checkpoint claim: {exc}") from None
    (d / "cluster.yaml").write_text(cluster_config_text())
    state = d / "state.json"
    state.write_text(
        json.dumps(
            {
                "pid": found.pid,
                "url": found.url,
                "instance": found.instance,
                "startedAt": found.started_at,
                "speed": speed,
                "workdir": found.workdir,
            }
        )
    )
    return found


def _wait_serving(proc: subprocess.Popen[bytes], log_path: Path, kubeconfig: Path) -> str | None:
    """The URL once kubesim serves and wrote its kubeconfig; ``None`` if it exited first."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        text = log_path.read_text(errors="replace")
        m = re.search(_SERVING, text)
        written = "kubeconfig written" in text and kubeconfig.exists()
        if m and written and "read-only kubeconfig written" in text:
            return m.group(1)
        if proc.poll() is not None:
            return None
        time.sleep(0.02)
    proc.terminate()
    raise UnavailableError(f"the dev cluster did not serve within {START_TIMEOUT:g}s; see {log_path}")


def stop(directory: Path | None = None, *, timeout: float = 10.0) -> DevCluster | None:
    """Stop the dev cluster (SIGTERM, then SIGKILL after ``timeout``); returns what was stopped."""
    d = directory or dev_dir()
    with _locked(d):
        found = running(d)
        if found is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(found.pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _alive(found.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(found.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(found.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(found.pid, os.WNOHANG)  # reap it when this process started it
        for name in ("state.json", "kubeconfig", "kubeconfig-readonly"):
            with contextlib.suppress(FileNotFoundError):
                (d / name).unlink()
        return found


# ---------------------------------------------------------------------- the `dispatch dev-cluster` commands


def _show(found: DevCluster, what: str, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"status": what, **found.to_json()}, sort_keys=True))
        return
    click.echo(f"dev cluster {what}: kubesim pid {found.pid} at {found.url} (speed x{found.speed:g})")
    if found.processes:
        click.echo(f"  pods run their commands as processes in {found.workdir} (behaviour scripts still run)")
    click.echo(f"  kubeconfig:           {found.kubeconfig}")
    if found.readonly_kubeconfig.exists():
        click.echo(f"  read-only kubeconfig: {found.readonly_kubeconfig}")
    click.echo(f"  cluster config:       {found.config}")
    click.echo(f"  log:                  {found.log}")
    click.echo(f"  kubectl --kubeconfig {found.kubeconfig} get trainjobs")
    click.echo("  with no --config, dispatch uses it; `dispatch dev-cluster stop` stops it")


@click.group("dev-cluster")
def command() -> None:
    """Keep a simulated Kubeflow cluster (kubesim) running in the background between commands."""


@command.command("start")
@click.option(
    "--speed",
    type=click.FloatRange(min=0.01, max=1000),
    default=DEFAULT_SPEED,
    show_default=True,
    help="Simulated seconds per real second.",
)
@click.option("--request-log", metavar="FILE", help="Append one JSON line per API request to FILE.")
@click.option(
    "--processes",
    is_flag=True,
    help="Pods run their real commands as local processes, in the current directory (jobs with a "
    "KUBESIM_SCRIPT keep running it).",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
def start_command(speed: float, request_log: str | None, processes: bool, as_json: bool) -> None:
    """Start the dev cluster (unless it runs) and write its kubeconfigs and cluster config."""
    try:
        found, started = start(
            speed=speed, request_log=request_log, workdir=Path.cwd() if processes else None
        )
    except (ConflictError, UnavailableError) as exc:
        click.echo(f"error: {exc}", err=True)
        raise click.exceptions.Exit(1) from None
    changed = request_log or speed != found.speed or processes != found.processes
    if not started and changed and not as_json:
        click.echo(
            "note: it was already running; stop it first to change --speed, --request-log or --processes",
            err=True,
        )
    _show(found, "started" if started else "running", as_json)


@command.command("stop")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
def stop_command(as_json: bool) -> None:
    """Stop the dev cluster. Its jobs go with it; their records stay (shown as `cluster gone`)."""
    found = stop()
    if as_json:
        click.echo(json.dumps({"status": "stopped" if found else "not running", "pid": found and found.pid}))
    elif found is None:
        click.echo("the dev cluster is not running")
    else:
        click.echo(f"stopped the dev cluster (kubesim pid {found.pid})")


@command.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
@click.option(
    "--kubeconfig",
    "kubeconfig_only",
    is_flag=True,
    help='Print only its kubeconfig\'s path: kubectl --kubeconfig "$(dispatch dev-cluster status --kubeconfig)".',
)
def status_command(as_json: bool, kubeconfig_only: bool) -> None:
    """Say whether the dev cluster runs, and where its kubeconfig is. Exit 1 when it does not run."""
    found = running()
    if found is not None and kubeconfig_only:
        click.echo(str(found.kubeconfig))
        return
    if found is None:
        if kubeconfig_only:
            click.echo(
                "error: the dev cluster is not running (`dispatch dev-cluster start` starts it)", err=True
            )
        elif as_json:
            click.echo(json.dumps({"status": "not running", "directory": str(dev_dir())}))
        else:
            click.echo("the dev cluster is not running (`dispatch dev-cluster start` starts it)")
        raise click.exceptions.Exit(1)
    try:
        unready: list[str] | None = unready_nodes(found)
        problem = ""
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        unready, problem = None, str(exc)
    if as_json:
        extra = {"unreadyNodes": unready} if unready is not None else {"nodesError": problem}
        click.echo(json.dumps({"status": "running", **found.to_json(), **extra}, sort_keys=True))
        return
    _show(found, "running", as_json)
    if unready is None:
        click.echo(f"  nodes: could not be read ({problem})")
    elif unready:
        click.echo(f"  nodes not Ready: {', '.join(unready)}")
    else:
        click.echo("  nodes: all Ready")
