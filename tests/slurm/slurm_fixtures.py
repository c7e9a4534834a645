"""Real Slurms and a real sshd for the Slurm adapter's tests, started by the tests and stopped by pid.

Three Slurm versions: this host's 22.05 (``LocalSlurm``, ``transport: local``), and 24.11 and 26.05 in
Debian roots (``RootSlurm``, reached over ssh as a login node). Like the PostgreSQL fixture: without the
binaries (or the roots) the tests skip saying why, and with ``CI`` set they fail instead, so CI cannot
pass without running them. ``.ci/run`` makes the roots (``python -m dispatch_slurm.debroot make``).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dispatch_slurm.debroot import RELEASES, find_root
from dispatch_slurm.localslurm import LocalSlurm, missing_binaries
from dispatch_slurm.rootslurm import RootSlurm

VERSIONS = ("22.05", *RELEASES)
"""Every Slurm the suites run on: this host's, then each Debian root's."""
ACCOUNTING = frozenset({"24.11"})
"""The versions whose cluster keeps accounting in slurmdbd (MariaDB), so the real sites' ``sacct``
(not the completion log's ``sacct -c``) is tested; the others keep a completion log."""

SSHD = Path("/usr/sbin/sshd")


def need(missing: list[str], what: str, how: str | None = None) -> None:
    """Skip (or, under CI, fail) when ``missing`` names absent binaries (or whatever ``how`` makes)."""
    if not missing:
        return
    text = f"{what} needs {', '.join(missing)} ({how or 'Debian: apt-get install ' + _packages(missing)})"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the Slurm tests, but {text}")
    pytest.skip(text)


def _packages(missing: list[str]) -> str:
    known = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd", "sshd": "openssh-server",
             "ssh": "openssh-client", "ssh-keygen": "openssh-client", "unshare": "util-linux",
             "nsenter": "util-linux", "setsid": "util-linux", "mariadbd": "mariadb-server",
             "mariadb-install-db": "mariadb-server"}  # fmt: skip
    return " ".join(sorted({known.get(m, "slurm-client") for m in missing}))


def start_slurm(root: Path, nodes: int = 3) -> LocalSlurm:
    need(missing_binaries(), "the Slurm adapter's tests")
    cluster = LocalSlurm(root, nodes=nodes)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def start_root_slurm(directory: Path, version: str, *, accounting: bool = False) -> RootSlurm:
    """Slurm ``version`` in its Debian root, started in ``directory`` (skip, or fail under CI, when the
    root or a tool is missing)."""
    missing = [b for b in ("unshare", "nsenter", "setsid", "ssh", "ssh-keygen") if shutil.which(b) is None]
    if accounting:
        missing += [b for b in ("mariadbd", "mariadb-install-db") if not _sbin(b)]
    need(missing, f"Slurm {version} in a Debian root")
    if os.geteuid() != 0:
        need(["root privileges"], f"Slurm {version} in a Debian root", "it mounts in a namespace of its own")
    root = find_root(version)
    if root is None:
        need(["its Debian root"], f"Slurm {version}", f"python -m dispatch_slurm.debroot make {version}")
    assert root is not None
    cluster = RootSlurm(directory, root, accounting=accounting)
    if cluster.version != version:
        pytest.fail(f"the root {root} holds Slurm {cluster.version}, not {version}: remake it (debroot)")
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _sbin(name: str) -> bool:
    return shutil.which(name) is not None or any(Path(d, name).exists() for d in ("/usr/sbin", "/sbin"))


@dataclass(frozen=True)
class Site:
    """One Slurm the suites run on: its version, the cluster (to cause events on it), and the settings
    under which the adapter reaches it (``local`` for 22.05, ``ssh`` to the root's login node else)."""

    version: str
    cluster: LocalSlurm | RootSlurm

    @property
    def accounting(self) -> bool:
        return self.cluster.accounting

    def settings(self, **extra: Any) -> dict[str, Any]:
        return {**self.cluster.settings(), "pollInterval": "500ms", **extra}

    def slurm(self, *argv: str) -> str:
        """A Slurm command on the cluster (as its admin or another user would run it); its stdout."""
        done = self.cluster.run(*argv)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout


@dataclass(frozen=True)
class Sshd:
    """An sshd on a loopback port that lets in one key (the tests'), and the files a client needs."""

    port: int
    pid: int
    identity_file: Path
    known_hosts: Path
    root: Path

    def stop(self) -> None:
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        for _ in range(100):
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)


def start_sshd(root: Path) -> Sshd:
    missing = [b for b in ("ssh", "ssh-keygen") if shutil.which(b) is None]
    if not SSHD.exists():
        missing.append("sshd")
    need(missing, "the ssh transport's tests")
    root.mkdir(parents=True, exist_ok=True)
    host_key, user_key = root / "host_key", root / "user_key"
    for key in (host_key, user_key):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    (root / "authorized_keys").write_text((root / "user_key.pub").read_text())
    (root / "authorized_keys").chmod(0o600)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = root / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {host_key}",
                f"PidFile {root / 'sshd.pid'}",
                # Only the test key gets in: the one authorized_keys file is ours, no passwords.
                f"AuthorizedKeysFile {root / 'authorized_keys'}",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "AcceptEnv none",
                "",
            ]
        )
    )
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation directory
    subprocess.run([str(SSHD), "-f", str(config), "-E", str(root / "sshd.log")], check=True)
    pid = 0
    for _ in range(100):
        text = (root / "sshd.pid").read_text().strip() if (root / "sshd.pid").exists() else ""
        if text.isdigit():
            pid = int(text)
            break
        time.sleep(0.05)
    host_pub = (root / "host_key.pub").read_text().split()
    known = root / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {host_pub[0]} {host_pub[1]}\n")
    return Sshd(port, pid, user_key, known, root)
