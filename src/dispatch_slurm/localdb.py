"""A private MariaDB on this host, in a directory, for a test cluster's slurmdbd.

It listens on 127.0.0.1 (TCP) only, so the slurmdbd of a cluster on this host and the slurmdbd inside
a Debian root (:mod:`dispatch_slurm.rootslurm`: same network, its own files) reach it the same way.
This host's MariaDB is Debian 12's 10.11; Debian 13's 11.8 made trixie's slurmdbd 24.11 stop at start
(``docs/slurm-configuration.md``, "Accounting").
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from dispatch_slurm.daemons import alive, port_busy, read_pid, terminate, wait_until

__all__ = ["BINARIES", "LocalDb"]

BINARIES = ("mariadbd", "mariadb-install-db")


@dataclass(frozen=True)
class LocalDb:
    """The MariaDB whose data, socket, pid file and log live under ``root``."""

    root: Path
    port: int

    @property
    def pidfile(self) -> Path:
        return self.root / "mariadbd.pid"

    @property
    def log(self) -> Path:
        return self.root / "mariadb.log"

    def pid(self) -> int | None:
        pid = read_pid(self.pidfile)
        return pid if pid is not None and alive(pid) else None

    def start(self, timeout: float = 60.0) -> None:
        data = self.root / "data"
        self.root.mkdir(parents=True, exist_ok=True)
        if not (data / "mysql").exists():
            done = subprocess.run(
                [_bin("mariadb-install-db"), f"--datadir={data}", "--user=root",
                 "--auth-root-authentication-method=normal", "--skip-test-db"],
                capture_output=True, text=True, timeout=120, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise RuntimeError(f"mariadb-install-db failed: {done.stderr.strip()[-500:]}")
        with self.log.open("ab") as log:
            # mariadbd stays in the foreground: started in its own session, it writes its pid file.
            subprocess.Popen(
                [_bin("mariadbd"), "--no-defaults", f"--datadir={data}", "--user=root",
                 "--bind-address=127.0.0.1", f"--port={self.port}", f"--socket={self.root / 'mysql.sock'}",
                 f"--pid-file={self.pidfile}", "--innodb-flush-log-at-trx-commit=0", "--skip-log-bin"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
            )  # fmt: skip
        wait_until(lambda: port_busy(self.port), timeout, "MariaDB to listen", self.log)

    def stop(self, timeout: float = 15.0) -> None:
        pid = read_pid(self.pidfile)
        if pid is not None:
            terminate(pid, timeout)


def _bin(name: str) -> str:
    found = shutil.which(name) or next(
        (str(p) for p in (Path("/usr/sbin", name), Path("/usr/bin", name)) if p.exists()), None
    )
    if found is None:
        raise RuntimeError(f"{name} is not installed (Debian: apt-get install mariadb-server)")
    return found
