"""A real Slurm of another version, inside a Debian root (:mod:`dispatch_slurm.debroot`), with an sshd
as its login node: what the tests run on Slurm 24.11 and 26.05 beside this host's 22.05.

The cluster lives in a directory of this host (``dir``: its config, state, logs, pid files, keys and
the jobs' ``work``), and runs in a private mount namespace (``unshare --mount --propagation private``),
so nothing is mounted on the host and everything goes with the namespace's last process:

- the root is the lower layer of an overlay whose upper layer is in ``dir``: the cached root stays as
  made, and several clusters (parallel test workers) run from one root at once;
- ``dir`` is bind-mounted at its own path inside, so the login node, the compute nodes and this host
  see the same ``slurm.conf``, pid files, logs and job outputs under the same paths (the shared workdir);
- ``proc``, ``dev`` and ``sys`` are mounted inside, and this host's ``/etc/hosts`` (the nodes'
  ``NodeHostname`` is this host's name, which the root's own hosts file does not know); a keeper process (``sleep infinity``, chrooted)
  holds the namespace open, and every command for the cluster runs through ``nsenter`` into it.

Inside: munged with its own key, ``slurmctld``, ``slurmd -N n1..nN`` (:mod:`dispatch_slurm.clusterconf`,
the same settings as the local 22.05 cluster, plus ``cgroup.conf`` with ``CgroupPlugin=disabled``),
optionally ``slurmdbd`` keeping its database in a MariaDB of this host (:mod:`dispatch_slurm.localdb`,
over loopback TCP), and an ``sshd`` on a loopback port that lets in one user key made here, whose host
key is pinned in a ``known_hosts`` file (no trust on first use). The adapter reaches the cluster as a
site's login node: ``settings()`` are ``transport: ssh``.

Stopping kills the daemons by their pid files, then every process of the namespace (the jobs'
``slurmstepd`` and tasks, whatever a killed daemon left) with its descendants.

Command line::

    python -m dispatch_slurm.rootslurm start DIR --slurm 24.11 [--accounting]   # writes DIR/cluster.yaml
    python -m dispatch_slurm.rootslurm status DIR
    python -m dispatch_slurm.rootslurm stop DIR
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dispatch_slurm.clusterconf import CGROUP_CONF, CLUSTER_NAME, Layout, Ports, slurm_conf, slurmdbd_conf
from dispatch_slurm.daemons import (
    alive,
    crash,
    descendants,
    free_ports,
    kill_all,
    port_busy,
    read_pid,
    terminate,
    wait_until,
)
from dispatch_slurm.debroot import slurm_version
from dispatch_slurm.localdb import LocalDb
from dispatch_slurm.localslurm import all_idle, preempt_node, wait_state_saved

__all__ = ["RootSlurm", "main"]

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SPOOL = "/var/spool/dispatch"
"""slurmd's spool inside the root (per node ``%n``): short, for the per-step Unix sockets."""
MUNGE_SOCKET = "/run/munge/munge.socket.2"

# Run by `unshare` in the new mount namespace; paths come as arguments, never pasted into the text.
_NAMESPACE = r"""
set -eu
lower=$1 upper=$2 work=$3 merged=$4 dir=$5 pidfile=$6
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work" "$merged"
mkdir -p "$merged$dir"
mount --bind "$dir" "$merged$dir"
mount --bind /etc/hosts "$merged/etc/hosts"
mount -t proc proc "$merged/proc"
mount --rbind /dev "$merged/dev"
mount -t sysfs sysfs "$merged/sys"
exec chroot "$merged" /bin/sh -c 'echo $$ > "$1"; exec sleep infinity' keeper "$pidfile"
"""


@dataclass(frozen=True)
class RootSlurm:
    """One Slurm cluster of the Slurm in ``root``, living in ``dir``."""

    dir: Path
    root: Path
    nodes: int = 3
    accounting: bool = False
    """With slurmdbd (in the root) and a MariaDB (on this host), so ``sacct`` reads a real database."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(self.dir).absolute())
        object.__setattr__(self, "root", Path(self.root).absolute())
        for path in (self.dir, self.root):
            if any(c in str(path) for c in ",:\n"):  # overlay's option syntax
                raise ValueError(f"{path}: a cluster or root path may hold no ',' or ':'")

    # --- places --------------------------------------------------------------------------------

    @property
    def version(self) -> str:
        """Slurm's major.minor in the root (``24.11``)."""
        return ".".join(slurm_version(self.root).split(".")[:2])

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def workdir(self) -> Path:
        """The jobs' directory, the same path on this host, the login node and every compute node."""
        return self.dir / "work"

    @property
    def logs(self) -> Path:
        return self.dir / "log"

    @property
    def node_names(self) -> list[str]:
        return [f"n{i}" for i in range(1, self.nodes + 1)]

    @property
    def layout(self) -> Layout:
        d = self.dir
        return Layout(
            state=f"{d}/state", spool=SPOOL, run=f"{d}/run", log=f"{d}/log", munge_socket=MUNGE_SOCKET
        )

    @property
    def db(self) -> LocalDb:
        return LocalDb(self.dir / "db", int(self._read("db-port") or 0))

    @property
    def ssh_port(self) -> int:
        return int(self._read("ssh/port") or 0)

    @property
    def identity_file(self) -> Path:
        return self.dir / "ssh" / "user_key"

    @property
    def known_hosts(self) -> Path:
        return self.dir / "ssh" / "known_hosts"

    def settings(self) -> dict[str, Any]:
        """The adapter's settings for this cluster: its login node over ssh."""
        return {
            "transport": "ssh",
            "slurmConf": str(self.conf),
            "workdir": str(self.workdir),
            "ssh": {
                "host": "127.0.0.1",
                "port": self.ssh_port,
                "user": "root",
                "identityFile": str(self.identity_file),
                "knownHosts": str(self.known_hosts),
            },
        }

    def _read(self, name: str) -> str:
        path = self.dir / name
        return path.read_text().strip() if path.exists() else ""

    # --- running inside ------------------------------------------------------------------------

    def keeper(self) -> int | None:
        """The pid of the process holding the cluster's namespace, while it runs."""
        pid = read_pid(self.dir / "run" / "keeper.pid")
        return pid if pid is not None and alive(pid) else None

    def run(self, *argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """A command inside the root (as the login or a compute node would run it), with
        ``SLURM_CONF`` naming this cluster; never raises on its exit."""
        keeper = self.keeper()
        if keeper is None:
            raise RuntimeError(f"the cluster in {self.dir} does not run")
        env = ["env", "-i", f"PATH={PATH}", "HOME=/root", "LANG=C.UTF-8", f"SLURM_CONF={self.conf}"]
        return subprocess.run(
            ["nsenter", f"--target={keeper}", "--mount", "--root", "--wd", "--", *env, *argv],
            capture_output=True, text=True, timeout=timeout, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip

    def _must(self, *argv: str) -> None:
        # The daemons fork into the background and write their pid files; their own output goes to logs.
        done = self.run(*argv)
        if done.returncode != 0:
            text = done.stderr.strip() or done.stdout.strip()
            raise RuntimeError(f"{argv[0]} failed (exit {done.returncode}): {text} (logs in {self.logs})")

    # --- configuration -------------------------------------------------------------------------

    def write_config(self) -> None:
        """Write munge's key, the ssh keys, slurm.conf, cgroup.conf (and slurmdbd.conf): fresh ports."""
        d = self.dir
        for sub in ("state", "log", "run", "work", "fs/upper", "fs/work", "fs/merged"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        for sub in ("munge", "ssh"):
            (d / sub).mkdir(mode=0o700, parents=True, exist_ok=True)
        key = d / "munge" / "munge.key"
        if not key.exists():
            key.write_bytes(secrets.token_bytes(1024))
            key.chmod(0o400)
        ctld, dbd, db, ssh, first_node = free_ports(4, consecutive=self.nodes)[:5]
        host = socket.gethostname().split(".")[0]
        ports = Ports(ctld, first_node, dbd if self.accounting else None)
        self.conf.write_text(slurm_conf(self.layout, ports, host=host, nodes=self.nodes))
        (d / "cgroup.conf").write_text(CGROUP_CONF)
        if self.accounting:
            # slurmdbd has no -f: it reads slurmdbd.conf (mode 600) beside $SLURM_CONF.
            dbd_conf = d / "slurmdbd.conf"
            dbd_conf.write_text(slurmdbd_conf(self.layout, dbd_port=dbd, db_port=db))
            dbd_conf.chmod(0o600)
            (d / "dbd-port").write_text(str(dbd))
            (d / "db-port").write_text(str(db))
        self._write_ssh(ssh)

    def _write_ssh(self, port: int) -> None:
        s = self.dir / "ssh"
        for key in (s / "host_key", self.identity_file):
            if not key.exists():
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        (s / "authorized_keys").write_text(self.identity_file.with_suffix(".pub").read_text())
        (s / "authorized_keys").chmod(0o600)
        (s / "port").write_text(str(port))
        kind, host_key = (s / "host_key.pub").read_text().split()[:2]
        self.known_hosts.write_text(f"[127.0.0.1]:{port} {kind} {host_key}\n")
        lines = [
            f"Port {port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {s / 'host_key'}",
            f"PidFile {self.dir / 'run' / 'sshd.pid'}",
            # Only the key made here gets in: the one authorized_keys file is ours, no passwords.
            f"AuthorizedKeysFile {s / 'authorized_keys'}",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
        ]
        (s / "sshd_config").write_text("\n".join(lines) + "\n")

    # --- daemons -------------------------------------------------------------------------------

    def _pidfiles(self) -> dict[str, Path]:
        run = self.dir / "run"
        files = {"munged": run / "munged.pid", "slurmctld": run / "slurmctld.pid", "sshd": run / "sshd.pid"}
        if self.accounting:
            files["slurmdbd"] = run / "slurmdbd.pid"
            files["mariadbd"] = self.db.pidfile
        for n in self.node_names:
            files[f"slurmd-{n}"] = run / f"slurmd-{n}.pid"
        return files

    def pids(self) -> dict[str, int | None]:
        """Each daemon's pid when it runs, else ``None`` (``keeper``: the namespace's holder)."""
        out: dict[str, int | None] = {"keeper": self.keeper()}
        for name, path in self._pidfiles().items():
            pid = read_pid(path)
            out[name] = pid if pid is not None and alive(pid) else None
        return out

    def status(self) -> dict[str, int | None]:
        return self.pids()

    def start(self, timeout: float = 60.0) -> None:
        """Enter the root, start munge, (slurmdbd), slurmctld, every slurmd and the login sshd; return
        once every node is idle."""
        self.write_config()
        self._start_namespace(timeout)
        spools = [f"{SPOOL}/{n}" for n in self.node_names]
        self._must("mkdir", "-p", "-m", "0755", "/run/munge", "/run/sshd", *spools)
        self.start_munge(timeout)
        if self.accounting:
            self.db.start(timeout)
            self._must("slurmdbd")
            dbd = int(self._read("dbd-port"))
            wait_until(lambda: port_busy(dbd), timeout, "slurmdbd to listen", self.logs)
            self._must("sacctmgr", "-i", "add", "cluster", CLUSTER_NAME)
        self.start_controller()
        for n in self.node_names:
            self.start_node(n)
        self.start_sshd(timeout)
        wait_until(lambda: all_idle(self.run, self.node_names), timeout, "every node to be idle", self.logs)

    def _start_namespace(self, timeout: float) -> None:
        d = self.dir
        pidfile = d / "run" / "keeper.pid"
        pidfile.unlink(missing_ok=True)
        with (self.logs / "namespace.log").open("ab") as log:
            # setsid -f: the namespace's first process is no child of ours (nothing to reap).
            subprocess.run(
                ["setsid", "-f", "unshare", "--mount", "--propagation", "private", "--fork",
                 "sh", "-c", _NAMESPACE, "namespace", str(self.root), str(d / "fs" / "upper"),
                 str(d / "fs" / "work"), str(d / "fs" / "merged"), str(d), str(pidfile)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, check=True,
            )  # fmt: skip
        wait_until(lambda: self.keeper() is not None, timeout, "the root's namespace", self.logs)

    def start_munge(self, timeout: float = 60.0) -> None:
        """Start munged (again: after :meth:`stop_munge`, with the same key)."""
        d = self.dir
        self._must(
            "munged", f"--socket={MUNGE_SOCKET}", f"--key-file={d / 'munge' / 'munge.key'}",
            f"--pid-file={d / 'run' / 'munged.pid'}", f"--log-file={d / 'log' / 'munged.log'}",
            f"--seed-file={d / 'munge' / 'munged.seed'}", "--force",
        )  # fmt: skip
        wait_until(lambda: self.run("test", "-S", MUNGE_SOCKET).returncode == 0, timeout, "munged", self.logs)

    def stop_munge(self) -> int:
        """An outage of munge: stop munged (by its pid). Every Slurm command and RPC fails until
        :meth:`start_munge`. Its pid."""
        pid = self._pid("munged")
        terminate(pid)
        self.run("rm", "-f", MUNGE_SOCKET)
        return pid

    def start_controller(self) -> None:
        """Start slurmctld (again: after :meth:`kill_controller`, it recovers its saved state)."""
        self._must("slurmctld", "-f", str(self.conf))

    def kill_controller(self, *, saved: bool = True) -> int:
        """A crash of the controller: SIGKILL slurmctld (by its pid). Its pid. ``saved``: first wait
        until slurmctld has saved the changes made so far (:func:`~dispatch_slurm.localslurm.wait_state_saved`)."""
        pid = self._pid("slurmctld")
        if saved:
            wait_state_saved(self.dir / "state", time.time())
        kill_all([pid])
        wait_until(lambda: not alive(pid), 30, "slurmctld to die", self.logs)
        return pid

    def start_node(self, node: str) -> None:
        """Start the slurmd of ``node`` (again)."""
        self._must("slurmd", "-f", str(self.conf), "-N", node)

    def kill_node(self, node: str) -> int:
        """Lose ``node`` as a crashed host would: SIGKILL its slurmd (by its pid) and everything that ran
        there for Slurm (the slurmstepd and processes of the jobs on it). The slurmd's pid."""
        jobs = set(self.run("squeue", "-h", "-w", node, "-o", "%i").stdout.split())
        pid = self._pid(f"slurmd-{node}")
        kill_all([pid])
        doomed = []
        for proc in self.processes():
            try:
                cmdline = Path(f"/proc/{proc}/cmdline").read_bytes().replace(b"\0", b" ")
                environ = Path(f"/proc/{proc}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            stepd = any(cmdline.startswith(f"slurmstepd: [{job}.".encode()) for job in jobs)
            task = f"SLURMD_NODENAME={node}".encode() in environ and any(
                f"SLURM_JOB_ID={job}".encode() in environ for job in jobs
            )
            if stepd or task:
                doomed.append(proc)
        crash(descendants(doomed))
        return pid

    def preempt(self, node: str, seconds: int = 3) -> str:
        """Submit a job of the higher-tier partition that takes all of ``node`` for ``seconds``: under
        preempt/partition_prio it preempts whatever runs there. Its job id."""
        return preempt_node(self.run, node, seconds)

    def start_sshd(self, timeout: float = 60.0) -> None:
        """Start the login node's sshd (again: after :meth:`stop_sshd`, same port and host key)."""
        s = self.dir / "ssh"
        self._must("/usr/sbin/sshd", "-f", str(s / "sshd_config"), "-E", str(self.logs / "sshd.log"))
        wait_until(lambda: port_busy(self.ssh_port), timeout, "sshd to listen", self.logs)

    def stop_sshd(self) -> int:
        """An outage of the login node: stop its sshd and cut every connection to it (SIGKILL of each
        session's sshd process: the client sees the connection drop). Its pid."""
        pid = self._pid("sshd")
        sessions = self._sessions(pid)
        terminate(pid)
        kill_all(sessions)
        return pid

    def cut_ssh(self) -> int:
        """Cut every ssh connection to the login node (SIGKILL of each session's sshd process), the
        sshd staying up: a client reconnects at its next command. How many were cut."""
        sessions = self._sessions(self._pid("sshd"))
        kill_all(sessions)
        return len(sessions)

    def _sessions(self, listener: int) -> list[int]:
        tree = descendants([listener])
        return [p for p in tree if p != listener and _parent(p) == listener]

    def stop(self, timeout: float = 15.0) -> None:
        """Stop the daemons by pid (slurmds, slurmctld, slurmdbd, sshd, munged: TERM, then KILL), then
        every process left in the namespace with its descendants, which ends the namespace."""
        order = [f"slurmd-{n}" for n in self.node_names] + ["slurmctld"]
        order += ["slurmdbd"] if self.accounting else []
        order += ["sshd", "munged"]
        files = self._pidfiles()
        for name in order:
            pid = read_pid(files[name])
            if pid is not None:
                terminate(pid, timeout)
        keeper = self.keeper()
        if keeper is not None:
            left = [p for p in self.processes() if p != keeper]
            kill_all(descendants(left))
            kill_all([keeper])
            deadline = time.monotonic() + timeout
            while any(alive(p) for p in [*left, keeper]) and time.monotonic() < deadline:
                time.sleep(0.05)
        if self.accounting:
            self.db.stop(timeout)

    def processes(self) -> list[int]:
        """Every process in the cluster's mount namespace (the daemons, the jobs' slurmstepd and
        tasks, the commands run inside), by the namespace's identity, not by name: other clusters run
        the same programs from the same root."""
        keeper = self.keeper()
        if keeper is None:
            return []
        try:
            ours = os.readlink(f"/proc/{keeper}/ns/mnt")
        except OSError:
            return []
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    if os.readlink(entry / "ns" / "mnt") == ours:
                        found.append(int(entry.name))
                except OSError:
                    continue
        return found

    def _pid(self, name: str) -> int:
        pid = read_pid(self._pidfiles()[name])
        if pid is None or not alive(pid):
            raise RuntimeError(f"{name} does not run (logs in {self.logs})")
        return pid


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _cluster_yaml(cluster: RootSlurm) -> str:
    # JSON is YAML: the settings as they are, with no quoting of our own.
    config = {"adapter": "slurm", "settings": {**cluster.settings(), "pollInterval": "1s"}}
    return json.dumps(config, indent=2) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    from dispatch_slurm.debroot import RELEASES, find_root

    parser = argparse.ArgumentParser(prog="python -m dispatch_slurm.rootslurm", description=__doc__)
    parser.add_argument("action", choices=("start", "stop", "status"))
    parser.add_argument("dir", type=Path, help="the directory the cluster lives in")
    parser.add_argument("--slurm", choices=sorted(RELEASES), help="the Slurm version (start)")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--accounting", action="store_true", help="also slurmdbd and MariaDB (sacct)")
    args = parser.parse_args(argv)
    d = args.dir.resolve()
    try:
        if args.action == "start":
            if args.slurm is None:
                parser.error("start needs --slurm")
            root = find_root(args.slurm)
            if root is None:
                raise RuntimeError(
                    f"no root for Slurm {args.slurm}: python -m dispatch_slurm.debroot make {args.slurm}"
                )
            d.mkdir(parents=True, exist_ok=True)
            (d / "root").write_text(f"{root}\n{args.nodes}\n{int(args.accounting)}\n")
            cluster = RootSlurm(d, root, nodes=args.nodes, accounting=args.accounting)
            cluster.start()
            (d / "cluster.yaml").write_text(_cluster_yaml(cluster))
            print(f"Slurm {slurm_version(root)} runs; its dispatch config: {d / 'cluster.yaml'}")
            return 0
        saved = (d / "root").read_text().split("\n") if (d / "root").exists() else []
        if len(saved) < 3:
            raise RuntimeError(f"no cluster was started in {d}")
        cluster = RootSlurm(d, Path(saved[0]), nodes=int(saved[1]), accounting=saved[2] == "1")
        if args.action == "stop":
            cluster.stop()
        else:
            for name, pid in cluster.status().items():
                print(f"{name}: {'running, pid ' + str(pid) if pid else 'stopped'}")
    except (RuntimeError, ValueError, OSError, subprocess.SubprocessError) as exc:
        print(f"rootslurm: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
