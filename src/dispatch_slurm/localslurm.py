"""A real Slurm on this host, for the tests, the benchmark and the tutorial.

Writes a ``slurm.conf`` into a directory, starts a private munge, ``slurmctld`` and several ``slurmd``
(Debian builds Slurm with multiple-slurmd support: each node is ``slurmd -N nK``) on 127.0.0.1, each
with a pid file, and stops them by those pids. Nothing of the host's own Slurm or munge is used.

The settings (:mod:`dispatch_slurm.clusterconf`) are the ones ``docs/slurm-configuration.md`` explains
(measured on Slurm 22.05): two partitions of different ``PriorityTier`` over the same nodes with
``PreemptMode=REQUEUE`` (so preemption can be caused), memory limits enforced without cgroups
(``OverMemoryKill``), a lost node noticed in about 20 s, a completion log instead of a database (or,
with ``accounting``, a private MariaDB and slurmdbd). The same cluster inside a Debian root, for other
Slurm versions: :mod:`dispatch_slurm.rootslurm`.

Command line (the tutorial's)::

    python -m dispatch_slurm.localslurm start DIR [--nodes 3]   # prints: export SLURM_CONF=DIR/slurm.conf
    python -m dispatch_slurm.localslurm status DIR
    python -m dispatch_slurm.localslurm stop DIR
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from dispatch_slurm.clusterconf import (
    CLUSTER_NAME,
    PARTITION_HIGH,
    Layout,
    Ports,
    slurm_conf,
    slurmdbd_conf,
)
from dispatch_slurm.daemons import (
    alive,
    crash,
    free_ports,
    kill_all,
    port_busy,
    read_pid,
    terminate,
    wait_until,
)
from dispatch_slurm.localdb import BINARIES as DB_BINARIES
from dispatch_slurm.localdb import LocalDb

__all__ = [
    "CLUSTER_NAME",
    "DAEMONS",
    "LocalSlurm",
    "Runner",
    "SlurmMissingError",
    "all_idle",
    "main",
    "missing_binaries",
    "preempt_node",
    "wait_state_saved",
]

DAEMONS = ("munged", "slurmctld", "slurmd")
ACCOUNTING = (*DB_BINARIES, "slurmdbd", "sacctmgr")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "sacct")
_SBIN = (Path("/usr/sbin"), Path("/usr/bin"), Path("/sbin"))


class Runner(Protocol):
    """Runs one command against a cluster (here, or inside its root); never raises on its exit."""

    def __call__(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]: ...


class SlurmMissingError(RuntimeError):
    """A binary the local Slurm needs is not installed."""


def _which(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in _SBIN:
        if (d / name).exists():
            return str(d / name)
    return None


def missing_binaries(*, accounting: bool = False) -> list[str]:
    """The binaries a local Slurm needs that are not installed (Debian: slurmctld slurmd slurm-client
    munge; with accounting also slurmdbd mariadb-server)."""
    names = (*DAEMONS, *CLIENTS, *(ACCOUNTING if accounting else ()))
    return [name for name in names if _which(name) is None]


def _processes() -> list[tuple[int, bytes, bytes]]:
    """(pid, command line, environment) of every process we may read."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        out.append((int(entry.name), cmdline, environ))
    return out


@dataclass(frozen=True)
class LocalSlurm:
    """One local Slurm cluster living in ``root`` (its config, state, logs, pid files and job files)."""

    root: Path
    nodes: int = 3
    accounting: bool = False
    """With MariaDB and slurmdbd, so that ``sacct`` (and ``sacct --json``) read a real database."""

    version = "22.05"
    """The Slurm this host has (Debian 12's); opening the cluster reads the exact one."""

    def __post_init__(self) -> None:
        # Absolute, because the daemons hand SLURM_CONF on to their jobs and _job_processes matches it.
        object.__setattr__(self, "root", Path(self.root).absolute())

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def sockets(self) -> Path:
        """Where the Unix sockets live: munged's, and the slurmds' spool directories, where slurmd makes
        one per job step (``n1_<job>.<step>``, the step up to 4294967292). A socket's path holds at most
        107 bytes, so under a deep root (pytest -n adds ``popen-gwN/``) they move to a short directory
        named after the root in the system's temporary directory: a longer path makes every job fail to
        launch ("could not launch job and not able to requeue it, cancelling job")."""
        if len(str(self.root)) + len("/spool/n99/n99_99999999.4294967292") <= 107:
            return self.root
        digest = hashlib.sha256(str(self.root).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"dispatch-slurm-{digest}"

    @property
    def spool(self) -> Path:
        return self.sockets / "spool"

    @property
    def munge_socket(self) -> Path:
        return self.sockets / "munge" / "munge.sock"

    @property
    def workdir(self) -> Path:
        """A directory shared by the "login node" and every compute node (the same host)."""
        return self.root / "work"

    @property
    def logs(self) -> Path:
        return self.root / "log"

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    @property
    def layout(self) -> Layout:
        r = self.root
        return Layout(
            state=f"{r}/state", spool=str(self.spool), run=f"{r}/run", log=f"{r}/log",
            munge_socket=str(self.munge_socket),
        )  # fmt: skip

    @property
    def db(self) -> LocalDb:
        port = (self.root / "db-port").read_text().strip() if (self.root / "db-port").exists() else "0"
        return LocalDb(self.root / "db", int(port))

    def settings(self) -> dict[str, Any]:
        """The adapter's settings for this cluster: its commands run here (``transport: local``)."""
        return {"slurmConf": str(self.conf), "workdir": str(self.workdir)}

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment under which Slurm's commands talk to this cluster."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """One of Slurm's commands (or any other) run against this cluster; never raises on its exit."""
        return subprocess.run(
            list(argv), env=self.env(), capture_output=True, text=True, timeout=timeout, check=False
        )

    # --- configuration -------------------------------------------------------------------------

    def write_config(self) -> None:
        """Write munge's key and slurm.conf (fresh ports each time)."""
        for sub in ("munge", "state", "log", "run", "work"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        for directory in (self.spool, self.munge_socket.parent):
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
            key.chmod(0o400)
        ctld_port, dbd_port, db_port, first_node = free_ports(3, consecutive=self.nodes)[:4]
        ports = Ports(ctld_port, first_node, dbd_port if self.accounting else None)
        host = socket.gethostname().split(".")[0]
        self.conf.write_text(slurm_conf(self.layout, ports, host=host, nodes=self.nodes))
        if self.accounting:
            # slurmdbd has no -f: it reads slurmdbd.conf (mode 600) beside $SLURM_CONF.
            dbd = self.root / "slurmdbd.conf"
            dbd.write_text(slurmdbd_conf(self.layout, dbd_port=dbd_port, db_port=db_port))
            dbd.chmod(0o600)
            (self.root / "db-port").write_text(str(db_port))

    # --- daemons -------------------------------------------------------------------------------

    def _pidfiles(self) -> dict[str, Path]:
        run = self.root / "run"
        files = {"munged": run / "munged.pid", "slurmctld": run / "slurmctld.pid"}
        if self.accounting:
            files["slurmdbd"] = run / "slurmdbd.pid"
            files["mariadbd"] = self.db.pidfile
        for n in self.node_names:
            files[f"slurmd-{n}"] = run / f"slurmd-{n}.pid"
        return files

    def pids(self) -> dict[str, int | None]:
        """Each daemon's pid when it runs, else ``None``."""
        out: dict[str, int | None] = {}
        for name, path in self._pidfiles().items():
            pid = read_pid(path)
            out[name] = pid if pid is not None and alive(pid) else None
        return out

    def start(self, timeout: float = 60.0) -> None:
        """Start munge, slurmctld and every slurmd; return once every node is idle."""
        missing = missing_binaries(accounting=self.accounting)
        if missing:
            raise SlurmMissingError(
                f"not installed: {', '.join(missing)} (Debian: apt-get install slurmctld slurmd slurm-client munge)"
            )
        self.write_config()
        self.start_munge(timeout)
        if self.accounting:
            self.db.start(timeout)
            self._start_dbd(timeout)
        self.start_controller()
        for n in self.node_names:
            self.start_node(n)
        wait_until(self._all_idle, timeout, "every node to be idle", self.logs)

    def start_munge(self, timeout: float = 60.0) -> None:
        """Start munged (again: after :meth:`stop_munge`, with the same key)."""
        self._run(
            [
                self._bin("munged"),
                f"--socket={self.munge_socket}",
                f"--key-file={self.root / 'munge' / 'munge.key'}",
                f"--pid-file={self.root / 'run' / 'munged.pid'}",
                f"--log-file={self.root / 'log' / 'munged.log'}",
                f"--seed-file={self.root / 'munge' / 'munged.seed'}",
                "--force",
            ]
        )
        wait_until(self.munge_socket.exists, timeout, "munged to open its socket", self.logs)

    def stop_munge(self) -> int:
        """An outage of munge: stop munged (by its pid). Every Slurm command and RPC fails until
        :meth:`start_munge`. Its pid."""
        pid = read_pid(self._pidfiles()["munged"])
        if pid is None:
            raise RuntimeError("munged has no pid file")
        terminate(pid)
        self.munge_socket.unlink(missing_ok=True)
        return pid

    def _start_dbd(self, timeout: float) -> None:
        self._run([self._bin("slurmdbd")])
        dbd_port = next(
            int(line.split("=", 1)[1])
            for line in (self.root / "slurmdbd.conf").read_text().splitlines()
            if line.startswith("DbdPort=")
        )
        wait_until(lambda: port_busy(dbd_port), timeout, "slurmdbd to listen", self.logs)
        self._run([self._bin("sacctmgr"), "-i", "add", "cluster", CLUSTER_NAME])

    def start_controller(self) -> None:
        """Start slurmctld (again: after :meth:`kill_controller`, it recovers its state)."""
        self._run([self._bin("slurmctld"), "-f", str(self.conf)])

    def kill_controller(self, *, saved: bool = True) -> int:
        """A crash of the controller: SIGKILL slurmctld (by its pid). Its pid.

        ``saved``: first wait until slurmctld has saved the changes made so far (see
        :func:`wait_state_saved`), so the restarted controller knows what ran; without it, a job
        started just before the crash comes back PENDING and its node is drained ("Duplicate jobid")."""
        pid = read_pid(self._pidfiles()["slurmctld"])
        if pid is None or not alive(pid):
            raise RuntimeError("slurmctld does not run")
        if saved:
            wait_state_saved(self.root / "state", time.time())
        kill_all([pid])
        wait_until(lambda: not alive(pid), 30, "slurmctld to die", self.logs)
        return pid

    def start_node(self, node: str) -> None:
        """Start the slurmd of ``node`` (again)."""
        self._run([self._bin("slurmd"), "-f", str(self.conf), "-N", node])

    def kill_node(self, node: str) -> int:
        """Lose ``node`` as a crashed host would: SIGKILL its slurmd (by its pid) and everything that ran
        there for Slurm (the slurmstepd and processes of the jobs on it). The slurmd's pid."""
        jobs = set(self.run("squeue", "-h", "-w", node, "-o", "%i").stdout.split())
        pid = read_pid(self._pidfiles()[f"slurmd-{node}"])
        if pid is None:
            raise RuntimeError(f"the slurmd of {node} has no pid file")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        doomed = []
        for proc, cmdline, environ in self._job_processes():
            stepd = any(cmdline.startswith(f"slurmstepd: [{job}.".encode()) for job in jobs)
            task = f"SLURMD_NODENAME={node}".encode() in environ and any(
                f"SLURM_JOB_ID={job}".encode() in environ for job in jobs
            )
            if stepd or task:
                doomed.append(proc)
        crash(doomed)
        return pid

    def preempt(self, node: str, seconds: int = 3) -> str:
        """Submit a job of the higher-tier partition that takes all of ``node`` for ``seconds``: under
        preempt/partition_prio it preempts whatever runs there. Its job id."""
        return preempt_node(self.run, node, seconds)

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every daemon by its pid (slurmds, slurmctld, munged): TERM, then KILL."""
        order = [k for k in self._pidfiles() if k.startswith("slurmd-")] + ["slurmctld"]
        order += ["slurmdbd"] if self.accounting else []
        files = self._pidfiles()
        for name in order:
            pid = read_pid(files[name])
            if pid is not None:
                terminate(pid, timeout)
        if self.accounting:
            self.db.stop(timeout)
        pid = read_pid(files["munged"])
        if pid is not None:
            terminate(pid, timeout)
        self._reap_job_processes()
        if self.sockets != self.root:
            shutil.rmtree(self.sockets, ignore_errors=True)

    def _reap_job_processes(self) -> None:
        # A killed slurmd leaves its slurmstepd and the job's processes (batch script, srun, tasks) behind.
        kill_all(proc for proc, _, _ in self._job_processes())

    def _job_processes(self) -> list[tuple[int, bytes, list[bytes]]]:
        """(pid, command line, environment entries) of the step daemons and job processes of THIS cluster.

        Job ids start at 1 in every cluster, so several clusters on one host (parallel test workers)
        share them: a process is ours only if its environment names our slurm.conf, which slurmd passes
        to every slurmstepd and job it starts."""
        conf = f"SLURM_CONF={self.conf}".encode()
        ours = []
        for proc, cmdline, environ in _processes():
            entries = environ.split(b"\0")
            if conf not in entries or proc == os.getpid():
                continue
            if cmdline.startswith(b"slurmstepd:") or any(e.startswith(b"SLURM_JOB_ID=") for e in entries):
                ours.append((proc, cmdline, entries))
        return ours

    def status(self) -> dict[str, int | None]:
        return self.pids()

    def _bin(self, name: str) -> str:
        found = _which(name)
        if found is None:
            raise SlurmMissingError(f"{name} is not installed")
        return found

    def _run(self, argv: Sequence[str]) -> None:
        # The daemons fork into the background and write their pid files; their own output goes to logs.
        proc = self.run(*argv)
        if proc.returncode != 0:
            raise RuntimeError(
                f"{Path(argv[0]).name} failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"
                f" (logs in {self.logs})"
            )

    def _all_idle(self) -> bool:
        return all_idle(self.run, self.node_names)


SAVE_MAX_WAIT = 5.0
"""slurmctld saves a change of its state at most this many seconds later (``SAVE_MAX_WAIT`` of
slurmctld/state_save.c), checking for work every second."""


def wait_state_saved(state: Path, since: float) -> None:
    """Wait until slurmctld has written its job state (``state/job_state``) after ``since`` (epoch
    seconds), or until it must have written whatever changed before: ``SAVE_MAX_WAIT`` and its poll
    later. Saving is not a command slurmctld takes; its file's time is what shows."""
    deadline = since + SAVE_MAX_WAIT + 1.5
    while time.time() < deadline:
        try:
            if (state / "job_state").stat().st_mtime > since:
                return
        except OSError:
            pass
        time.sleep(0.1)


def all_idle(run: Runner, nodes: Sequence[str]) -> bool:
    """Whether ``sinfo`` (run by ``run``) shows every node of ``nodes`` idle."""
    proc = run("sinfo", "-h", "-N", "-o", "%N %t", timeout=30)
    if proc.returncode != 0:
        return False
    states = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2:
            states[parts[0]] = parts[1]
    return set(states) == set(nodes) and all(s == "idle" for s in states.values())


def preempt_node(run: Runner, node: str, seconds: int) -> str:
    """Submit (by ``run``) a job of the higher-tier partition that takes all of ``node`` for
    ``seconds``: under preempt/partition_prio it preempts whatever runs there. Its job id."""
    done = run("sbatch", "--parsable", "-p", PARTITION_HIGH, "-w", node, "--exclusive", "-o", "/dev/null",
               "--wrap", f"sleep {seconds}")  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"sbatch of the preempting job failed: {done.stderr.strip()}")
    return done.stdout.strip().split(";")[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dispatch_slurm.localslurm", description=__doc__)
    parser.add_argument("action", choices=("start", "stop", "status"))
    parser.add_argument("dir", type=Path, help="the directory the cluster lives in")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--accounting", action="store_true", help="also MariaDB and slurmdbd (sacct)")
    args = parser.parse_args(argv)
    accounting = args.accounting or (args.dir / "slurmdbd.conf").exists()
    cluster = LocalSlurm(args.dir.resolve(), nodes=args.nodes, accounting=accounting)
    try:
        if args.action == "start":
            cluster.start()
            print(f"export SLURM_CONF={cluster.conf}")
        elif args.action == "stop":
            cluster.stop()
        else:
            for name, pid in cluster.status().items():
                print(f"{name}: {'running, pid ' + str(pid) if pid else 'stopped'}")
    except (SlurmMissingError, RuntimeError) as exc:
        print(f"localslurm: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
