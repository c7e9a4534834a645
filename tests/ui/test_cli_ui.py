"""``dispatch ui`` and ``dispatch supervise --ui-address`` as real processes: where they serve, what
they refuse, and the warning beyond loopback."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

CONFIG = "adapter: memory\nsettings:\n  nodes: 2\nstore:\n  sqlite: jobs.db\n"


def _dispatch(tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    (tmp_path / "cluster.yaml").write_text(CONFIG)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}}
    env["DISPATCH_STATE_DIR"] = str(tmp_path / "state")
    return subprocess.Popen(
        [sys.executable, "-m", "dispatch.cli", *args, "--config", str(tmp_path / "cluster.yaml")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        return str(resp.read().decode())


def test_supervise_serves_the_page_beside_its_metrics(tmp_path: Path) -> None:
    proc = _dispatch(
        tmp_path, "supervise", "--json", "--poll", "0.2", "--lease", "5",
        "--metrics-address", "127.0.0.1:0", "--ui-address", "127.0.0.1:0",
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        started = json.loads(proc.stdout.readline())
        assert started["event"] == "started" and started["metricsPort"] > 0
        page = started["page"]
        assert page.startswith("http://127.0.0.1:")
        body = _get(page)
        assert "<h1>Jobs</h1>" in body and "no jobs yet" in body
        assert "dispatch_leases_held" in _get(f"http://127.0.0.1:{started['metricsPort']}/metrics")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err


def test_ui_prints_where_it_serves_and_stops_on_sigterm(tmp_path: Path) -> None:
    proc = _dispatch(tmp_path, "ui", "--address", "127.0.0.1:0")
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("serving the page at http://127.0.0.1:") and "read-only" in line
        assert "<h1>Jobs</h1>" in _get(line.split()[4])
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "no authentication" not in err  # loopback: nothing to warn about


def test_beyond_loopback_it_says_it_has_no_authentication(tmp_path: Path) -> None:
    # 192.0.2.1 (TEST-NET-1) is on no interface here: the warning comes first, then the bind fails.
    proc = _dispatch(tmp_path, "ui", "--address", "192.0.2.1:0")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "warning: the page is served on 192.0.2.1, beyond this machine, and has no authentication" in err
    assert "error: cannot serve the page at 192.0.2.1:0" in err
    assert "Traceback" not in err


def test_a_bad_address_is_refused_naming_the_option(tmp_path: Path) -> None:
    proc = _dispatch(tmp_path, "ui", "--address", "8321")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--address: expected HOST:PORT" in err, err
    proc = _dispatch(tmp_path, "supervise", "--ui-address", "localhost")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--ui-address: expected HOST:PORT" in err, err
