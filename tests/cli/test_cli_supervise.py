"""The supervisor through the CLI: `dispatch run` supervises its job, `dispatch history` tells every
incarnation, `dispatch supervise` is a daemon that stops cleanly on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from dispatch import JobSpec, decide
from dispatch.cli.commands import cli
from dispatch.cli.jobfile import load_spec
from dispatch.records import SqliteStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("DISPATCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("DISPATCH_CONFIG", raising=False)
    monkeypatch.delenv("DISPATCH_TOKEN", raising=False)
    yield
    # The embedded default runs on the dev cluster, which outlives the command: stop it.
    from dispatch.cli import devcluster

    devcluster.stop(tmp_path / "state" / "dev-cluster")


def memory_example(tmp_path: Path, name: str) -> Path:
    """An example job file for the memory adapter: without ``kubeflow/RuntimeRef``, which it refuses."""
    import yaml

    doc = yaml.safe_load((EXAMPLES / name).read_text())
    doc.get("extensions", {}).pop("kubeflow/RuntimeRef", None)
    path = tmp_path / f"memory-{name}"
    path.write_text(yaml.safe_dump(doc))
    return path


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def history(job: str, *config: str | Path) -> list[dict[str, str]]:
    result = invoke("history", *config, job, "--json")
    assert result.exit_code == 0, result.stdout
    out: list[dict[str, str]] = json.loads(result.stdout)
    return out


@pytest.mark.parametrize(
    ("example", "cause"), [("preempted.yaml", "preempted"), ("node-lost.yaml", "node_lost")]
)
def test_run_requeues_once_and_succeeds_on_the_default_config(example: str, cause: str) -> None:
    """The embedded default config (no --config): its policy requeues preemption and node loss."""
    result = invoke("run", EXAMPLES / example, "--job-id", "j1")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "outcome: succeeded / none  (j1@2.1)" in result.stdout
    ts = history("j1")
    ended = [
        (t["epoch"], t.get("state"), t.get("cause")) for t in ts if t.get("state") in ("failed", "succeeded")
    ]
    assert ended == [("1.0", "failed", cause), ("2.1", "succeeded", "none")]
    requeues = [t for t in ts if t["what"] == "requeued"]
    assert len(requeues) == 1 and requeues[0]["epoch"] == "2.1" and requeues[0]["actor"] == "supervisor"
    assert f"policy rule {cause}: requeue (max 3, backoff 1 s" in requeues[0]["why"]
    text = invoke("history", "j1").stdout
    assert "incarnations:" in text
    assert (
        f"  1 (j1@1.0): failed / {cause}  — requeued as 2.1: 1.0 ended failed/{cause}; policy rule {cause}"
        in text
    )
    assert "  2 (j1@2.1): succeeded / none" in text


def test_run_oom_under_a_policy_that_does_not_requeue_it_fails_without_a_requeue() -> None:
    result = invoke("run", EXAMPLES / "oom.yaml", "--job-id", "j1")
    assert result.exit_code == 1
    assert "outcome: failed / out_of_memory  (j1@1.0)" in result.stdout
    ts = history("j1")
    assert not [t for t in ts if t["what"] == "requeued"]
    assert ts[-1]["what"] == "gave up" and "out_of_memory: fail" in ts[-1]["why"]
    assert (
        "  1 (j1@1.0): failed / out_of_memory  — gave up: policy default rule out_of_memory: fail"
        in invoke("history", "j1").stdout
    )


def test_supervise_flags_are_checked(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["supervise", "--lease", "2", "--poll", "1"])
    assert result.exit_code == 2
    assert "--lease" in result.stderr


def test_supervise_once_takes_a_step_and_releases(tmp_path: Path) -> None:
    config = tmp_path / "cluster.yaml"
    config.write_text(
        f"adapter: memory\nsettings: {{cluster: sup-{uuid.uuid4().hex[:8]}, startDelay: 0}}\nstore: {{sqlite: jobs.db}}\n"
    )
    hello = memory_example(tmp_path, "hello.yaml")
    assert invoke("submit", "--config", config, hello, "--job-id", "j1").exit_code == 0
    result = invoke("supervise", "--config", config, "--once", "--holder", "me", "--json")
    assert result.exit_code == 0, result.stdout
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events[0]["event"] == "started" and events[-1]["event"] == "stopped"
    assert all(e["supervisor"] == "me" for e in events)


def test_supervise_daemon_requeues_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    """A real daemon over a SQLite store. The memory cluster lives in the daemon's process, so the jobs
    are pending records, as a submit that stopped before starting leaves them (an acknowledged
    submission): the daemon places them, requeues the preempted one, and on SIGTERM releases the lease
    it holds on the one still running and exits 0."""
    db = tmp_path / "jobs.db"
    config = tmp_path / "cluster.yaml"
    config.write_text(
        "adapter: memory\nsettings: {startDelay: 0, cessationDelay: 0.2}\nstore: {sqlite: jobs.db}\n"
        "policy: {rules: {preempted: {action: requeue, max: 2, backoff: 0.5}}}\n"
    )
    preempted = load_spec(str(memory_example(tmp_path, "preempted.yaml")))
    asyncio.run(_pending(db, "j1", preempted))
    asyncio.run(_pending(db, "j2", JobSpec(command=("train",), env={"KUBESIM_SCRIPT": "sleep 600; exit 0"})))
    env = {**os.environ, "DISPATCH_STATE_DIR": str(tmp_path / "state")}
    args = ["supervise", "--config", str(config), "--poll", "0.2", "--lease", "5", "--holder", "d1"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "dispatch.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        state = None
        while time.monotonic() < deadline:
            state = asyncio.run(_state(db))
            if state["j1"][:2] == ("succeeded", "2.1") and state["j2"][0] == "running":
                break
            time.sleep(0.2)
        assert state is not None and state["j1"][:2] == ("succeeded", "2.1")
        assert state["j2"] == ("running", "1.0", "d1")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert "Traceback" not in err
    assert "requeue (policy rule preempted" in out
    assert out.splitlines()[-1] == "supervisor d1: stopped, leases released"
    assert asyncio.run(_state(db))["j2"][2] is None


async def _pending(db: Path, job_id: str, spec: JobSpec) -> None:
    store = SqliteStore(db)
    try:
        rec, first = decide.submitted(job_id, spec, policy=None, held=False, now=time.time())
        await store.create(rec, first)
    finally:
        await store.close()


async def _state(db: Path) -> dict[str, tuple[str, str, str | None]]:
    store = SqliteStore(db)
    try:
        return {
            r.job_id: (r.state.value, str(r.epoch), r.lease.holder if r.lease is not None else None)
            for r in await store.list()
        }
    finally:
        await store.close()


def test_supervise_serves_metrics_and_writes_json_logs(tmp_path: Path) -> None:
    """`dispatch supervise --metrics-address --log-format json` in a real process, on the embedded dev
    cluster (the daemon only acts on records of its own cluster, so the job goes there too): the endpoint
    answers while it runs and counts the job it gave up on (a time limit, the default policy fails it), the
    log lines are JSON with the job's context, and SIGTERM stops it cleanly."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    env["DISPATCH_STATE_DIR"] = str(tmp_path / "state")
    job = tmp_path / "job.yaml"
    job.write_text(
        "command: [train]\ntimeLimit: 2\nenv: {KUBESIM_SCRIPT: 'sleep 60'}\nextensions:\n"
        "  dispatch/Image: {ref: 'example.com/train:1'}\n"
        "  kubeflow/RuntimeRef: {kind: ClusterTrainingRuntime, name: torch-distributed}\n"
    )
    cli = [sys.executable, "-m", "dispatch.cli"]
    try:
        submitted = subprocess.run(
            [*cli, "submit", str(job), "--job-id", "m1"], env=env, cwd=tmp_path, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        _serve_metrics_and_json_logs(cli, env, tmp_path, port)
    finally:
        subprocess.run([*cli, "dev-cluster", "stop"], env=env, cwd=tmp_path, capture_output=True, timeout=60)


def _serve_metrics_and_json_logs(cli: list[str], env: dict[str, str], tmp_path: Path, port: int) -> None:
    import urllib.request

    proc = subprocess.Popen(
        [*cli, "supervise", "--poll", "0.2", "--lease", "5", "--metrics-address", f"127.0.0.1:{port}",
         "--log-format", "json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        text = ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                    text = resp.read().decode()
            except OSError:
                time.sleep(0.2)
                continue
            if "dispatch_outcomes_total{" in text:
                break
            time.sleep(0.2)
        assert "dispatch_leases_held" in text
        outcomes = [line for line in text.splitlines() if line.startswith("dispatch_outcomes_total{")]
        assert [line.rsplit(" ", 1)[1] for line in outcomes] == ["1.0"], outcomes
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    lines = [json.loads(line) for line in err.splitlines() if line.startswith("{")]
    acted = [x for x in lines if x.get("job_id") == "m1" and x.get("action")]
    assert acted, err
    assert {"time", "level", "logger", "message", "epoch", "cause"} <= set(acted[0])
