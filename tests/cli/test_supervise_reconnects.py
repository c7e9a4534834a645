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

    def drain(self) -> list[str]:
        """Every line printed so far (read without waiting)."""
        while True:
            try:
                self.seen.append(self.queue.get_nowait())
            except Empty:
                return self.seen


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


def _probe(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return int(resp.status), resp.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


@pytest.mark.timeout(900)  # real processes and a probe on a loaded machine: generous, never a measure
def test_readyz_is_503_while_a_killed_dev_cluster_does_not_answer_and_200_once_it_is_back(
    session: Session,
) -> None:
    """Issue 38: a daemon whose cluster does not answer is not ready. The dev cluster killed (SIGKILL, by
    its pid: no goodbye to the watches), the supervisor's own account of its cluster says so at once —
    ``/readyz`` answers 503 naming the cluster that does not answer, while the daemon still holds its
    connection (the Kubeflow watch retrying, the cache answering reads) rather than only once it gave up
    and reconnects; started again, the daemon reconnects and is ready again."""
    started = session.run("dev-cluster", "start")
    assert started.returncode == 0, started.stderr
    # No job: a step that acts on one could fail on the dead cluster before the account says so.
    pid = int(json.loads((session.home / "state" / "dev-cluster" / "state.json").read_text())["pid"])

    proc = subprocess.Popen(
        [str(BIN / "dispatch"), "--json", "supervise", "--poll", "0.5", "--lease", "5",
         "--metrics-address", "127.0.0.1:0"],
        cwd=session.home, env=session.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        lines = Lines(proc)
        port = int(lines.until(lambda e: e.get("event") == "started", "start")["metricsPort"])
        for _ in range(600):  # ready once a step went through without an error
            if _probe(port, "/readyz")[0] == 200:
                break
            time.sleep(0.2)
        assert _probe(port, "/readyz") == (200, "ok\n"), lines.seen

        os.kill(pid, signal.SIGKILL)
        for _ in range(3000):
            code, why = _probe(port, "/readyz")
            if code == 503:
                break
            time.sleep(0.1)
        assert code == 503, lines.seen
        # The supervisor's account of its cluster, not a step that failed after the watch gave up.
        assert "the cluster does not answer" in why, (why, lines.drain())
        assert not any('"reconnecting"' in line or "cannot-open" in line for line in lines.drain()), (
            lines.seen
        )
        assert _probe(port, "/healthz")[0] == 200

        again = session.run("dev-cluster", "start")
        assert again.returncode == 0, again.stderr
        for _ in range(3000):
            if _probe(port, "/readyz")[0] == 200:
                break
            time.sleep(0.2)
        assert _probe(port, "/readyz") == (200, "ok\n"), lines.seen
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    assert rc == 0
