"""A record belongs to one cluster (SPEC §6.1), through the CLI as a person meets it: a job submitted to
one cluster (a kubesim served on its own, named by a config file) and read with another config (the
embedded default, its dev cluster) over the same store is shown as last known — never refreshed to
``lost``, never cancelled, never supervised there — while its own cluster can still end it.

Real processes throughout: ``python -m kubesim serve``, the ``dispatch`` console script, its dev cluster."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent

JOB = """\
command: [python, -m, train]
env: {KUBESIM_SCRIPT: "print working; sleep 3600; exit 0"}  # runs until its own cluster cancels it
extensions:
  dispatch/Image: {ref: "example.org/train:1"}
  kubeflow/RuntimeRef: {kind: ClusterTrainingRuntime, name: torch-distributed}
"""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Path]:
    """A kubesim of its own (not the dev cluster), and a config file naming it and the default store."""
    kc = tmp_path / "other.kubeconfig"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubesim", "serve", "--kubeconfig", str(kc), "--speed", "4", "--no-kueue"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        while "kubeconfig written" not in proc.stdout.readline():
            assert proc.poll() is None, "kubesim serve exited early"
        config = tmp_path / "other-cluster.yaml"
        config.write_text(
            "adapter: kubeflow\n"
            f"settings: {{kubeconfig: {kc}, namespace: default}}\n"
            f"store: {{sqlite: {tmp_path / 'state' / 'jobs.db'}}}\n"
        )
        yield config
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_a_job_of_another_cluster_is_last_known_and_ended_only_by_its_own(
    served: Path, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    env["DISPATCH_STATE_DIR"] = str(tmp_path / "state")  # the embedded default's store: the same file

    def dispatch(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "dispatch"), *args],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    job = tmp_path / "job.yaml"
    job.write_text(JOB)
    try:
        submitted = dispatch("submit", str(job), "--job-id", "elsewhere", "--config", str(served))
        assert submitted.returncode == 0, submitted.stdout + submitted.stderr
        before = json.loads(dispatch("status", "elsewhere", "-o", "json", "--config", str(served)).stdout)
        cluster = before["cluster"]
        assert cluster.startswith("kubernetes:"), before

        # Read with the embedded default (the dev cluster starts): shown as last known, nothing written.
        status = dispatch("status", "elsewhere")
        assert status.returncode == 0, status.stderr
        assert f"cluster: {cluster} (not this one); shown as last known" in status.stdout, status.stdout
        listed = dispatch("list", "-o", "json")
        (row,) = json.loads(listed.stdout)
        assert row["revision"] == before["revision"] and row["lastKnown"] == f"{cluster} (not this one)"
        assert row["outcome"]["state"] != "lost"
        cancel = dispatch("cancel", "elsewhere")
        assert cancel.returncode != 0 and "not this one" in cancel.stderr, cancel.stdout + cancel.stderr
        for _ in range(2):  # a lost reading would need a second one: neither is made
            supervised = dispatch("supervise", "--once", "--poll", "0.1", "--lease", "5")
            assert supervised.returncode == 0, supervised.stderr
            assert "left alone: 1 job(s) of another cluster (elsewhere)" in supervised.stdout, (
                supervised.stdout
            )
        after = json.loads(dispatch("status", "elsewhere", "-o", "json").stdout)
        assert after["revision"] == before["revision"]

        # Its own cluster ends it (the job runs until then: a finished record would not show this at all).
        # It is stopping while its pods terminate; --wait waits for its end.
        cancelled = dispatch("cancel", "elsewhere", "--wait", "--config", str(served))
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        own = json.loads(dispatch("status", "elsewhere", "-o", "json", "--config", str(served)).stdout)
        assert own["outcome"]["state"] == "cancelled", own

        # One corrupt row and one row of another adapter's cluster in the same store: one line each, and
        # the others are listed and supervised.
        _corrupt_and_foreign(tmp_path / "state" / "jobs.db")
        listed = dispatch("list")
        assert listed.returncode == 0, listed.stderr
        assert "elsewhere" in listed.stdout and "foreign" in listed.stdout
        assert [ln for ln in listed.stderr.splitlines() if ln.startswith("skipped:")] == [
            ln for ln in listed.stderr.splitlines() if "corrupt" in ln
        ]
        assert len([ln for ln in listed.stderr.splitlines() if "corrupt" in ln]) == 1
        supervised = dispatch("supervise", "--once", "--poll", "0.1", "--lease", "5")
        assert supervised.returncode == 0, supervised.stdout + supervised.stderr
        assert len([ln for ln in supervised.stdout.splitlines() if "skipped: corrupt" in ln]) == 1
        assert "left alone: 1 job(s) of another cluster (foreign)" in supervised.stdout, supervised.stdout
    finally:
        dispatch("dev-cluster", "stop", timeout=60)


def _corrupt_and_foreign(path: Path) -> None:
    """Edit the store as another tool would: a row whose JSON is cut short, and a record of a Slurm cluster."""
    import sqlite3

    raw = sqlite3.connect(path)
    try:
        seq, body = raw.execute("SELECT seq, body FROM records WHERE job_id = 'elsewhere'").fetchone()
        record = json.loads(body)
        columns = [c[1] for c in raw.execute("PRAGMA table_info(records)")]
        row = dict(
            zip(
                columns,
                raw.execute("SELECT * FROM records WHERE job_id = 'elsewhere'").fetchone(),
                strict=True,
            )
        )
        for job, text in (
            ("corrupt", '{"jobId": "corrupt", "spec": '),
            ("foreign", json.dumps(record | {
                "jobId": "foreign",
                "cluster": "slurm:far@ctl",
                "outcome": {"state": "running", "cause": "none", "evidence": []},
                "handle": {"backend": "slurm", "identity": {"jobId": "foreign", "epoch": "1.0"}, "ref": "4242",
                           "cluster": "slurm:far@ctl"},
            })),
        ):  # fmt: skip
            values = row | {"job_id": job, "body": text, "seq": None, "state": "running"}
            names = [c for c in columns if c != "seq"]
            raw.execute(
                f"INSERT INTO records ({', '.join(names)}) VALUES ({', '.join('?' for _ in names)})",
                [values[c] for c in names],
            )
        raw.commit()
        del seq
    finally:
        raw.close()
