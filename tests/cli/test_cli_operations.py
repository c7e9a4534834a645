"""`dispatch supervise` as a service: with `--log-format json` everything it writes is JSON lines (the
probe's steps, its notes, its final error), and beside /metrics it answers the /healthz and /readyz
probes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest


def dispatch(*args: str, env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dispatch.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
    )


def json_lines(text: str) -> list[dict[str, object]]:
    """Every line of ``text`` as JSON: a plain line fails the test, naming it."""
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}\nin:\n{text}")
    return out


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    out = {**os.environ, "DISPATCH_STATE_DIR": str(tmp_path / "state")}
    out.pop("DISPATCH_CONFIG", None)
    out.pop("DISPATCH_TOKEN", None)
    return out


def test_json_logs_are_json_lines_only_probe_notes_and_final_error_included(
    tmp_path: Path, env: dict[str, str]
) -> None:
    # The embedded default: it starts the dev cluster (a note) and the Kubeflow adapter probes it.
    try:
        proc = dispatch("supervise", "--once", "--log-format", "json", env=env, cwd=tmp_path)
        out, err = proc.communicate(timeout=300)
    finally:
        from dispatch.cli import devcluster

        devcluster.stop(tmp_path / "state" / "dev-cluster")
    assert proc.returncode == 0, err
    said = json_lines(err)
    messages = [str(x["message"]) for x in said]
    assert any(m.startswith("probe:") for m in messages), messages
    assert any(m.startswith("started the dev cluster") for m in messages), messages
    assert [x.get("event") for x in json_lines(out)] == ["started", "stopped"]

    bad = dispatch("supervise", "--log-format", "json", "--lease", "1", "--poll", "1", env=env, cwd=tmp_path)
    out, err = bad.communicate(timeout=120)
    assert bad.returncode != 0
    last = json_lines(err)[-1]
    assert last["level"] == "error" and "--lease" in str(last["message"]), err
    assert out == ""


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_supervisor_answers_health_probes_beside_its_metrics(tmp_path: Path, env: dict[str, str]) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = tmp_path / "cluster.yaml"
    config.write_text("adapter: memory\nsettings:\n  nodes: 2\nstore:\n  sqlite: jobs.db\n")
    proc = dispatch(
        "supervise", "--config", str(config), "--poll", "0.2", "--lease", "5",
        "--metrics-address", f"127.0.0.1:{port}", "--log-format", "json",
        env=env, cwd=tmp_path,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        answers: dict[str, tuple[int, str]] = {}
        while time.monotonic() < deadline:
            try:
                answers = {p: get(base + p) for p in ("/healthz", "/readyz", "/metrics", "/nope")}
            except OSError:
                time.sleep(0.2)
                continue
            if answers["/readyz"][0] == 200:
                break
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert answers["/healthz"] == (200, "ok\n")
    assert answers["/readyz"] == (200, "ok\n")
    assert answers["/nope"][0] == 404
    metrics_text = answers["/metrics"][1]
    assert "dispatch_leases_held" in metrics_text and "dispatch_admission_leader" not in metrics_text
    json_lines(err)


def test_dispatch_admission_json_logs_end_with_a_json_error_line(tmp_path: Path, env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "dispatch_kubeflow.admission", "--log-format", "json",
         "--kubeconfig", str(tmp_path / "missing")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2
    last = json_lines(done.stderr)[-1]
    assert last["level"] == "error" and "missing" in str(last["message"]), done.stderr
