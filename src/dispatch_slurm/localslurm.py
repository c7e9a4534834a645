"""A real Slurm on this host, for the tests, the benchmark and the tutorial.

Writes a ``slurm.conf`` into a directory, starts a private munge, ``slurmctld`` and several ``slurmd``
(Debian builds Slurm with multiple-slurmd support: each node is ``slurmd -N nK``) on 127.0.0.1, each
with a pid file, and stops them by those pids. Nothing of the host's own Slurm or munge is used.

The settings are the ones ``docs/slurm-configuration.md`` explains (measured on Slurm 22.05): two
partitions of different ``PriorityTier`` over the same nodes with ``PreemptMode=REQUEUE`` (so preemption
can be caused), memory limits enforced without cgroups (``OverMemoryKill``), a lost node noticed in
about 20 s, a completion log instead of a database.

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

__all__ = ["CLUSTER_NAME", "DAEMONS", "LocalSlurm", "SlurmMissingError", "main", "missing_binaries"]

CLUSTER_NAME = "dispatch-local"
PARTITION_LOW = "batch"
PARTITION_HIGH = "urgent"
NODE_CPUS = 4
NODE_MEMORY_MB = 2000

DAEMONS = ("munged", "slurmctld", "slurmd")
ACCOUNTING = ("mariadbd", "mariadb-install-db", "slurmdbd", "sacctmgr")
CLIENTS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "sacct")
_SBIN = (Path("/usr/sbin"), Path("/usr/bin"), Path("/sbin"))


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


def _free_ports(count: int) -> list[int]:
    # Bound together so the kernel gives distinct ports; released just before the daemons bind them.
    socks = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (Linux: its /proc entry exists and it is not a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


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


def _read_pid(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


@dataclass(frozen=True)
class LocalSlurm:
    """One local Slurm cluster living in ``root`` (its config, state, logs, pid files and job files)."""

    root: Path
    nodes: int = 3
    accounting: bool = False
    """With MariaDB and slurmdbd, so that ``sacct`` (and ``sacct --json``) read a real database."""

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
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment under which Slurm's commands talk to this cluster."""
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = str(self.conf)
        return env

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
        ctld_port, dbd_port, db_port, *node_ports = _free_ports(3 + self.nodes)
        host = socket.gethostname().split(".")[0]
        r = self.root
        lines = [
            f"ClusterName={CLUSTER_NAME}",
            f"SlurmctldHost={host}(127.0.0.1)",
            f"SlurmctldPort={ctld_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"AuthInfo=socket={self.munge_socket},cred_expire=10",
            "CommunicationParameters=NoInAddrAny",
            f"StateSaveLocation={r}/state",
            f"SlurmdSpoolDir={self.spool}/%n",
            f"SlurmctldPidFile={r}/run/slurmctld.pid",
            f"SlurmdPidFile={r}/run/slurmd-%n.pid",
            f"SlurmctldLogFile={r}/log/slurmctld.log",
            f"SlurmdLogFile={r}/log/slurmd-%n.log",
            "SlurmdParameters=config_overrides",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/linux",
            "JobAcctGatherParams=OverMemoryKill",
            "JobAcctGatherFrequency=task=1",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "DefMemPerCPU=100",
            "SchedulerType=sched/backfill",
            "SlurmdTimeout=10",
            "SlurmctldTimeout=30",
            "ReturnToService=2",
            "KillWait=5",
            "MinJobAge=600",
            "InactiveLimit=0",
            "PreemptType=preempt/partition_prio",
            "PreemptMode=REQUEUE",
            *(
                [
                    "AccountingStorageType=accounting_storage/slurmdbd",
                    "AccountingStorageHost=127.0.0.1",
                    f"AccountingStoragePort={dbd_port}",
                    # Else the slurmctld→slurmdbd link uses munge's default socket.
                    f"AccountingStoragePass={self.munge_socket}",
                ]
                if self.accounting
                else ["AccountingStorageType=accounting_storage/none"]
            ),
            "JobCompType=jobcomp/filetxt",
            f"JobCompLoc={r}/log/jobcomp.txt",
            f"NodeName=n[1-{self.nodes}] NodeHostname={host} NodeAddr=127.0.0.1 "
            f"Port=[{node_ports[0]}-{node_ports[0] + self.nodes - 1}] "
            f"CPUs={NODE_CPUS} RealMemory={NODE_MEMORY_MB} State=UNKNOWN",
            f"PartitionName={PARTITION_LOW} Nodes=n[1-{self.nodes}] Default=YES PriorityTier=1 "
            "MaxTime=INFINITE State=UP",
            f"PartitionName={PARTITION_HIGH} Nodes=n[1-{self.nodes}] PriorityTier=2 MaxTime=INFINITE State=UP",
        ]
        # Node ports must be consecutive for the Port=[a-b] range: take them from the first free one.
        if any(_port_busy(node_ports[0] + i) for i in range(self.nodes)):
            return self.write_config()
        self.conf.write_text("\n".join(lines) + "\n")
        if self.accounting:
            self._write_dbd_config(dbd_port, db_port)

    def _write_dbd_config(self, dbd_port: int, db_port: int) -> None:
        # slurmdbd has no -f: it reads slurmdbd.conf (mode 600) beside $SLURM_CONF.
        r = self.root
        dbd = r / "slurmdbd.conf"
        dbd.write_text(
            "\n".join(
                [
                    "AuthType=auth/munge",
                    f"AuthInfo=socket={self.munge_socket}",
                    "DbdHost=localhost",
                    "DbdAddr=127.0.0.1",
                    f"DbdPort={dbd_port}",
                    "SlurmUser=root",
                    f"PidFile={r}/run/slurmdbd.pid",
                    f"LogFile={r}/log/slurmdbd.log",
                    "StorageType=accounting_storage/mysql",
                    "StorageHost=127.0.0.1",
                    f"StoragePort={db_port}",
                    "StorageUser=root",
                    "StorageLoc=slurm_acct_db",
                    "",
                ]
            )
        )
        dbd.chmod(0o600)
        (r / "db-port").write_text(str(db_port))

    # --- daemons -------------------------------------------------------------------------------

    def _pidfiles(self) -> dict[str, Path]:
        run = self.root / "run"
        files = {"munged": run / "munged.pid", "slurmctld": run / "slurmctld.pid"}
        if self.accounting:
            files["slurmdbd"] = run / "slurmdbd.pid"
            files["mariadbd"] = run / "mariadbd.pid"
        for n in self.node_names:
            files[f"slurmd-{n}"] = run / f"slurmd-{n}.pid"
        return files

    def pids(self) -> dict[str, int | None]:
        """Each daemon's pid when it runs, else ``None``."""
        out: dict[str, int | None] = {}
        for name, path in self._pidfiles().items():
            pid = _read_pid(path)
            out[name] = pid if pid is not None and _alive(pid) else None
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
            self._start_accounting(timeout)
        self.start_controller()
        for n in self.node_names:
            self.start_node(n)
        self._wait(self._all_idle, timeout, "every node to be idle")

    def _start_accounting(self, timeout: float) -> None:
        r = self.root
        data = r / "db"
        if not (data / "mysql").exists():
            self._run(
                [
                    self._bin("mariadb-install-db"),
                    f"--datadir={data}",
                    "--user=root",
                    "--auth-root-authentication-method=normal",
                    "--skip-test-db",
                ]
            )
        port = (r / "db-port").read_text().strip()
        log = (r / "log" / "mariadb.log").open("ab")
        # mariadbd stays in the foreground: started in its own session, it writes its pid file.
        subprocess.Popen(
            [
                self._bin("mariadbd"),
                "--no-defaults",
                f"--datadir={data}",
                "--user=root",
                "--bind-address=127.0.0.1",
                f"--port={port}",
                f"--socket={r / 'run' / 'mysql.sock'}",
                f"--pid-file={r / 'run' / 'mariadbd.pid'}",
                "--innodb-flush-log-at-trx-commit=0",
                "--skip-log-bin",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        self._wait(lambda: _port_busy(int(port)), timeout, "MariaDB to listen")
        self._run([self._bin("slurmdbd")])
        dbd_port = next(
            int(line.split("=", 1)[1])
            for line in (r / "slurmdbd.conf").read_text().splitlines()
            if line.startswith("DbdPort=")
        )
        self._wait(lambda: _port_busy(dbd_port), timeout, "slurmdbd to listen")
        cluster = next(
            line.split("=", 1)[1]
            for line in self.conf.read_text().splitlines()
            if line.startswith("ClusterName=")
        )
        self._run([self._bin("sacctmgr"), "-i", "add", "cluster", cluster])

    def start_munge(self, timeout: float = 60.0) -> None:
        """Start this cluster's munged (again), and wait for its socket."""
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
        self._wait(lambda: self.munge_socket.exists(), timeout, "munged to open its socket")

    def stop_munge(self) -> None:
        """Stop this cluster's munged (by its pid) and wait until it is gone: every Slurm command then
        fails to authenticate ("Munge encode failed")."""
        self._kill("munged", signal.SIGTERM)

    def start_controller(self) -> None:
        """Start slurmctld (again): it recovers the jobs from its saved state."""
        self._run([self._bin("slurmctld"), "-f", str(self.conf)])

    def kill_controller(self) -> None:
        """SIGKILL slurmctld (by its pid), as a crash would, and wait until it is gone."""
        self._kill("slurmctld", signal.SIGKILL)

    def _kill(self, daemon: str, sig: signal.Signals) -> None:
        pid = _read_pid(self._pidfiles()[daemon])
        if pid is None:
            raise RuntimeError(f"{daemon} has no pid file")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        self._wait(lambda: not _alive(pid), 30.0, f"{daemon} to end")

    def start_node(self, node: str) -> None:
        """Start the slurmd of ``node`` (again)."""
        self._run([self._bin("slurmd"), "-f", str(self.conf), "-N", node])

    def kill_node(self, node: str) -> int:
        """Lose ``node`` as a crashed host would: SIGKILL its slurmd (by its pid) and everything that ran
        there for Slurm (the slurmstepd and processes of the jobs on it). The slurmd's pid."""
        listed = subprocess.run(
            [self._bin("squeue"), "-h", "-w", node, "-o", "%i"],
            env=self.env(), capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        jobs = set(listed.stdout.split())
        pid = _read_pid(self._pidfiles()[f"slurmd-{node}"])
        if pid is None:
            raise RuntimeError(f"the slurmd of {node} has no pid file")
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        for proc, cmdline, environ in self._job_processes():
            stepd = any(cmdline.startswith(f"slurmstepd: [{job}.".encode()) for job in jobs)
            task = f"SLURMD_NODENAME={node}".encode() in environ and any(
                f"SLURM_JOB_ID={job}".encode() in environ for job in jobs
            )
            if stepd or task:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(proc, signal.SIGKILL)
        return pid

    def preempt(self, node: str, seconds: int = 3) -> str:
        """Submit a job of the higher-tier partition that takes all of ``node`` for ``seconds``: under
        preempt/partition_prio it preempts whatever runs there. Its job id."""
        done = subprocess.run(
            [self._bin("sbatch"), "--parsable", "-p", PARTITION_HIGH, "-w", node, "--exclusive", "-o", "/dev/null",
             "--wrap", f"sleep {seconds}"],
            env=self.env(), capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return done.stdout.strip().split(";")[0]

    def stop(self, timeout: float = 15.0) -> None:
        """Stop every daemon by its pid (slurmds, slurmctld, munged): TERM, then KILL."""
        order = [k for k in self._pidfiles() if k.startswith("slurmd-")] + ["slurmctld"]
        order += ["slurmdbd", "mariadbd"] if self.accounting else []
        order += ["munged"]
        files = self._pidfiles()
        for name in order:
            pid = _read_pid(files[name])
            if pid is None or not _alive(pid):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        self._reap_job_processes()
        if self.sockets != self.root:
            shutil.rmtree(self.sockets, ignore_errors=True)

    def _reap_job_processes(self) -> None:
        # A killed slurmd leaves its slurmstepd and the job's processes (batch script, srun, tasks) behind.
        for proc, _, _ in self._job_processes():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(proc, signal.SIGKILL)

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
        proc = subprocess.run(
            list(argv), env=self.env(), capture_output=True, text=True, timeout=60, check=False
        )
        if proc.returncode != 0:
            raise RuntimeError(
                f"{Path(argv[0]).name} failed (exit {proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}"
                f" (logs in {self.root / 'log'})"
            )

    def _all_idle(self) -> bool:
        proc = subprocess.run(
            [self._bin("sinfo"), "-h", "-N", "-o", "%N %t"],
            env=self.env(),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if proc.returncode != 0:
            return False
        states = {}
        for line in proc.stdout.splitlines():
            parts = line.split()
            if len(parts) == 2:
                states[parts[0]] = parts[1]
        return set(states) == set(self.node_names) and all(s == "idle" for s in states.values())

    def _wait(self, ready: object, timeout: float, what: str) -> None:
        assert callable(ready)
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what} (logs in {self.root / 'log'})")
            time.sleep(0.1)


def _port_busy(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


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
