"""A real Slurm and a real sshd for the Slurm adapter's tests, started by the tests and stopped by pid.

Like the PostgreSQL fixture: without the binaries the tests skip saying why, and with ``CI`` set they
fail instead, so CI cannot pass without running them.
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

import pytest

from dispatch_slurm.localslurm import LocalSlurm, missing_binaries

SSHD = Path("/usr/sbin/sshd")


def need(missing: list[str], what: str) -> None:
    """Skip (or, under CI, fail) when ``missing`` names absent binaries."""
    if not missing:
        return
    text = f"{what} needs {', '.join(missing)} (Debian: apt-get install {_packages(missing)})"
    if os.environ.get("CI"):
        pytest.fail(f"CI must run the Slurm tests, but {text}")
    pytest.skip(text)


def _packages(missing: list[str]) -> str:
    known = {"munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd", "sshd": "openssh-server",
             "ssh": "openssh-client", "ssh-keygen": "openssh-client"}  # fmt: skip
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
