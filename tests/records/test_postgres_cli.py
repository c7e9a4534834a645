"""The CLI's exit codes against a real PostgreSQL store: ``supervise --once`` whose actions fail (a
role that may only SELECT) exits non-zero, and ``dispatch check`` reads the store, so a store that is
down or refuses the password fails it, naming the store and never printing the password."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from pgserver import PASSWORD, ROLE, PgServer

from dispatch.cli.commands import cli


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def config(tmp_path: Path, cluster: str, store: str, name: str) -> Path:
    path = tmp_path / name
    path.write_text(
        f"adapter: memory\nsettings: {{cluster: {cluster}, startDelay: 0, cessationDelay: 0.2}}\nstore: {store}\n"
    )
    return path


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("DISPATCH_CONFIG", raising=False)
    monkeypatch.delenv("DISPATCH_TOKEN", raising=False)


def test_supervise_once_exits_non_zero_when_a_select_only_role_cannot_act(
    pg_server: PgServer, pg_dsn: str, tmp_path: Path
) -> None:
    cluster = f"pg-cli-{uuid.uuid4().hex[:10]}"
    owner = config(tmp_path, cluster, pg_dsn, "owner.yaml")
    job = tmp_path / "job.yaml"
    job.write_text("command: [train]\n")
    submitted = invoke("--config", owner, "submit", job)
    assert submitted.exit_code == 0, submitted.output

    dbname = pg_dsn.rsplit("/", 1)[1]
    reader = f"reader_{uuid.uuid4().hex[:8]}"
    pg_server.admin(f"CREATE ROLE {reader} LOGIN PASSWORD 'read-only-pw'")
    pg_server.admin(f"GRANT CONNECT ON DATABASE {dbname} TO {reader}")
    pg_server.admin(
        f"GRANT USAGE ON SCHEMA public TO {reader}; GRANT SELECT ON ALL TABLES IN SCHEMA public TO {reader}",
        dbname,
    )
    select_only = config(
        tmp_path,
        cluster,
        f"postgresql://{reader}:read-only-pw@127.0.0.1:{pg_server.port}/{dbname}",
        "reader.yaml",
    )
    listed = invoke("--config", select_only, "list")
    assert listed.exit_code == 0, listed.output  # reading is allowed

    result = invoke("--config", select_only, "supervise", "--once", "--lease", "10", "--poll", "1")
    assert result.exit_code == 1, result.output
    # Refused when it opens the store (it records its identity there) or in the step: either way, exit 1.
    assert "PermissionDenied" in result.output or "permission denied" in result.output
    assert "read-only-pw" not in result.output

    ok = invoke("--config", owner, "supervise", "--once", "--lease", "10", "--poll", "1")
    assert ok.exit_code == 0, ok.output  # the owner's step succeeds: the exit code is about failures


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when this returns: nothing listens there


def test_check_fails_when_the_store_is_down_naming_it(tmp_path: Path) -> None:
    port = _closed_port()
    cf = config(
        tmp_path,
        f"c-{uuid.uuid4().hex[:8]}",
        f"postgresql://{ROLE}:s3cret-pw@127.0.0.1:{port}/nodb",
        "c.yaml",
    )
    result = invoke("--config", cf, "check")
    assert result.exit_code != 0, result.output
    assert f"127.0.0.1:{port}/nodb" in result.output
    assert "s3cret-pw" not in result.output


def test_check_fails_on_a_wrong_password_without_printing_it(
    pg_server: PgServer, pg_dsn: str, tmp_path: Path
) -> None:
    wrong = pg_dsn.replace(f":{PASSWORD}@", ":wrong-pw-123@")
    assert wrong != pg_dsn
    result = invoke("--config", config(tmp_path, f"c-{uuid.uuid4().hex[:8]}", wrong, "c.yaml"), "check")
    assert result.exit_code != 0, result.output
    assert "cannot log in" in result.output and pg_dsn.rsplit("/", 1)[1] in result.output
    assert "wrong-pw-123" not in result.output and PASSWORD not in result.output
    good = invoke("--config", config(tmp_path, f"c-{uuid.uuid4().hex[:8]}", pg_dsn, "g.yaml"), "check")
    assert good.exit_code == 0, good.output


def test_supervise_on_a_wrong_password_logs_its_retries_naming_the_store(
    pg_server: PgServer, pg_dsn: str, tmp_path: Path
) -> None:
    """``--log-format json``: every line the daemon writes is a JSON log line (psycopg's included), the
    retries among them, and they name the store — not "the cluster" — and never the password."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    wrong = pg_dsn.replace(f":{PASSWORD}@", ":wrong-pw-456@")
    cf = config(tmp_path, f"c-{uuid.uuid4().hex[:8]}", wrong, "c.yaml")
    env = {**os.environ, "DISPATCH_STATE_DIR": str(tmp_path / "state")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dispatch.cli", "--config", str(cf), "supervise", "--log-format", "json",
         "--poll", "0.2", "--lease", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    seen: list[dict[str, object]] = []
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and sum("retrying in" in str(x.get("message")) for x in seen) < 2:
            line = proc.stderr.readline()
            assert line, "the supervisor ended early"
            seen.append(json.loads(line))  # a plain line fails here
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    for line in err.splitlines():
        seen.append(json.loads(line))
    retries = [str(x["message"]) for x in seen if "retrying in" in str(x.get("message"))]
    assert len(retries) >= 2, seen
    assert all(r.startswith("cannot open the store (postgresql://") for r in retries), retries
    assert proc.returncode == 0 and out == ""
    text = json.dumps(seen)
    assert "wrong-pw-456" not in text and PASSWORD not in text and "the cluster" not in text
