"""A throwaway PostgreSQL server for the tests and the benchmark, from the Debian ``postgresql`` package.

``find_bin()`` locates ``initdb``/``pg_ctl`` (``$DISPATCH_PG_BIN``, else the newest
``/usr/lib/postgresql/<ver>/bin``, else ``PATH``); ``PgServer.start()`` runs ``initdb`` and ``pg_ctl``
in a fresh temporary directory, listening on 127.0.0.1 on a free port (and a unix socket in that
directory), and ``stop()`` removes everything. PostgreSQL refuses to run as root, so as root the
programs run as the ``postgres`` system user (``runuser``).

The server has two roles: the superuser ``postgres`` (trusted, over the unix socket only: the tests
create databases with it) and ``dispatch`` (password over TCP, scram-sha-256: what the stores use, so
the password handling is real). Durability settings are off for speed: the tests kill clients, never
the server.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

PASSWORD = "s3cret-Pa55-do-not-print"
ROLE = "dispatch"


def find_bin() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``, or ``None``."""
    override = os.environ.get("DISPATCH_PG_BIN")
    if override:
        return Path(override)
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3].split(".")[0])
    )
    if found:
        return Path(found[-1]).parent
    which = shutil.which("pg_ctl")
    return Path(which).parent if which else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PgServer:
    bindir: Path
    root: Path
    port: int
    _as_postgres: list[str] = field(default_factory=list)
    _counter: int = 0

    @property
    def data(self) -> Path:
        return self.root / "data"

    def dsn(self, dbname: str, *, password: bool = True) -> str:
        """A URL for ``dbname`` as the ``dispatch`` role over TCP (with the password unless told not)."""
        auth = f"{ROLE}:{PASSWORD}" if password else ROLE
        return f"postgresql://{auth}@127.0.0.1:{self.port}/{dbname}"

    def admin_conninfo(self, dbname: str = "postgres") -> str:
        return f"host={self.root} port={self.port} user=postgres dbname={dbname}"

    @classmethod
    def start(cls, bindir: Path) -> PgServer:
        root = Path(tempfile.mkdtemp(prefix="dispatch-pg-"))
        prefix: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
            prefix = ["runuser", "-u", "postgres", "--"]
        server = cls(bindir, root, _free_port(), prefix)
        try:
            server._run(
                "initdb",
                "-D",
                str(server.data),
                "-U",
                "postgres",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C",
            )
            opts = " ".join(
                [
                    "-c listen_addresses=127.0.0.1",
                    f"-p {server.port}",
                    f"-k {root}",
                    "-c fsync=off",
                    "-c synchronous_commit=off",
                    "-c full_page_writes=off",
                    "-c max_connections=300",
                    "-c shared_buffers=32MB",
                ]
            )
            server._run("pg_ctl", "-D", str(server.data), "-l", str(root / "log"), "-w", "-o", opts, "start")
            server.admin(f"CREATE ROLE {ROLE} LOGIN CREATEDB PASSWORD '{PASSWORD}'")
        except BaseException:
            server.stop()
            raise
        return server

    def _run(self, program: str, *args: str) -> None:
        proc = subprocess.run(
            [*self._as_postgres, str(self.bindir / program), *args],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            log = ""
            if (self.root / "log").exists():
                log = (self.root / "log").read_text(errors="replace")
            raise RuntimeError(f"{program} failed ({proc.returncode}): {proc.stdout}{proc.stderr}{log}")

    def admin(self, sql: str, dbname: str = "postgres") -> None:
        import psycopg

        with psycopg.connect(self.admin_conninfo(dbname), autocommit=True) as conn:
            conn.execute(sql.encode())

    def new_database(self) -> str:
        """A fresh, empty database owned by the ``dispatch`` role; returns its name."""
        self._counter += 1
        name = f"t{os.getpid()}_{self._counter}"
        self.admin(f"CREATE DATABASE {name} OWNER {ROLE} TEMPLATE template0")
        return name

    def drop_database(self, name: str) -> None:
        """Drop a test's database (closing its connections): the server's disk stays small."""
        self.admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        if (self.data / "postmaster.pid").exists():
            try:
                self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "-w", "stop")
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
        shutil.rmtree(self.root, ignore_errors=True)
