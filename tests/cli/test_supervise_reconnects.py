"""The supervisor daemon outlives its cluster (SPEC §7): real processes — ``dispatch supervise`` and the
dev cluster (kubesim) it supervises. Killing the dev cluster and starting it again (a new port) under a
running supervisor: it notices, says so, re-reads the configuration and reconnects by itself; its
``/readyz`` says 503 meanwhile and 200 again after, ``/healthz`` 200 throughout; SIGTERM ends it, 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from queue import Empty, Queue
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
JOB = """\
command: [python, -m, train]
env: {KUBESIM_SCRIPT: "print working; sleep 1; exit 0"}
extensions:
  dispatch/Image: {ref: "example.org/train:1"}
  kubeflow/RuntimeRef: {kind: ClusterTrainingRuntime, name: torch-distributed}
"""


class Session:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
        self.env["DISPATCH_STATE_DIR"] = str(home / "state")

    def run(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(BIN / "dispatch"), *args], cwd=self.home, env=self.env, capture_output=True, text=True,
            timeout=timeout,
        )  # fmt: skip
        return done

    def url(self) -> str:
        state = json.loads((self.home / "state" / "dev-cluster" / "state.json").read_text())
        return str(state["url"])


@pytest.fixture
def session(tmp_path: Path) -> Iterator[Session]:
    s = Session(tmp_path)
    try:
        yield s
    finally:
        s.run("dev-cluster", "stop", timeout=30)


class Lines:
    """The JSON lines a daemon prints, read by a thread (a blocking pipe cannot be polled otherwise)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.queue: Queue[str] = Queue()
        self.seen: list[str] = []
        assert proc.stdout is not None
        stdout = proc.stdout
        threading.Thread(target=lambda: [self.queue.put(line) for line in stdout], daemon=True).start()

    def until(self, want: Any, what: str, timeout: float = 150) -> dict[str, Any]:
        """The first event ``want`` accepts. ``timeout`` bounds the wait for a hang (lines that keep
        coming count as progress only up to 200 of them)."""
        for _ in range(200):
            try:
                line = self.queue.get(timeout=timeout)
            except Empty:
                raise AssertionError(f"no {what} within {timeout} s; printed: {self.seen}") from None
            self.seen.append(line)
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if want(event):
                return dict(event)
        raise AssertionError(f"no {what} in 200 lines: {self.seen}")


def _get(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.mark.timeout(900)  # real processes and a probe on a loaded machine: generous, never a measure
def test_supervise_reconnects_to_a_dev_cluster_started_again_on_a_new_port(session: Session) -> None:
    started = session.run("dev-cluster", "start")
    assert started.returncode == 0, started.stderr
    first_url = session.url()
    (session.home / "job.yaml").write_text(JOB)
    submitted = session.run("submit", "job.yaml", "--job-id", "before")
    assert submitted.returncode == 0, submitted.stderr

    proc = subprocess.Popen(
        [str(BIN / "dispatch"), "--json", "supervise", "--poll", "0.5", "--lease", "5",
         "--metrics-address", "127.0.0.1:0"],
        cwd=session.home, env=session.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        lines = Lines(proc)
        port = int(lines.until(lambda e: e.get("event") == "started", "start")["metricsPort"])
        assert _get(port, "/healthz") == 200

        stopped = session.run("dev-cluster", "stop")
        assert stopped.returncode == 0, stopped.stderr
        lines.until(lambda e: e.get("event") in ("reconnecting", "cannot-open"), "the loss")
        assert _get(port, "/readyz") == 503
        assert _get(port, "/healthz") == 200
        again = session.run("dev-cluster", "start")
        assert again.returncode == 0, again.stderr
        assert session.url() != first_url, "a new port"
        lines.until(lambda e: e.get("event") == "started", "the reconnect")

        after = session.run("submit", "job.yaml", "--job-id", "after")
        assert after.returncode == 0, after.stderr
        for _ in range(600):  # ready once a step on the new cluster went through without an error
            if _get(port, "/readyz") == 200:
                break
            time.sleep(0.2)
        assert _get(port, "/readyz") == 200, lines.seen
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    assert rc == 0
