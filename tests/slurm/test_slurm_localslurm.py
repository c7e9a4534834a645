"""The local Slurm the tests and the tutorial start: several of them on one host (parallel test workers,
a tutorial beside the suite) must not touch each other's jobs, and stopping one leaves no job behind."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from slurm_fixtures import start_slurm

from dispatch_slurm.localslurm import LocalSlurm


def _job_processes(cluster: LocalSlurm) -> list[int]:
    """Pids of processes started for a job of ``cluster`` (its SLURM_CONF and a SLURM_JOB_ID)."""
    conf = f"SLURM_CONF={cluster.conf}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if conf in environ and state != "Z" and any(e.startswith(b"SLURM_JOB_ID=") for e in environ):
            pids.append(int(entry.name))
    return pids


def _submit_sleeper(cluster: LocalSlurm) -> str:
    done = subprocess.run(
        ["sbatch", "--parsable", "-N", "2", "-o", "/dev/null", "--wrap", "srun sleep 600"],
        env=cluster.env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return done.stdout.strip().split(";")[0]


def _wait_for(predicate: Callable[[], bool], what: str) -> None:
    for _ in range(600):
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _state(cluster: LocalSlurm, job: str) -> str:
    shown = subprocess.run(
        ["squeue", "-h", "-j", job, "-o", "%T"], env=cluster.env(), capture_output=True, text=True, timeout=60
    )
    return shown.stdout.strip()


def test_two_clusters_share_job_ids_but_not_their_processes(tmp_path: Path) -> None:
    a = start_slurm(tmp_path / "a", nodes=2)
    try:
        b = start_slurm(tmp_path / "b", nodes=2)
        try:
            job_a, job_b = _submit_sleeper(a), _submit_sleeper(b)
            assert job_a == job_b  # every cluster counts from 1: the id alone cannot tell them apart
            _wait_for(
                lambda: len(_job_processes(a)) >= 4 and len(_job_processes(b)) >= 4, "both jobs running"
            )
            before_b = set(_job_processes(b))

            a.kill_node("n1")  # a crashed host in cluster a

            assert before_b <= set(_job_processes(b)), "cluster b's job lost processes to a's node failure"
            assert _state(b, job_b) == "RUNNING"
            b.stop()
            _wait_for(lambda: not _job_processes(b), "cluster b's job processes to end after its stop")
        finally:
            b.stop()
        a.stop()
        _wait_for(lambda: not _job_processes(a), "cluster a's job processes to end after its stop")
    finally:
        a.stop()


def test_a_cluster_under_a_deep_directory_runs_its_jobs(tmp_path: Path) -> None:
    """slurmd makes a Unix socket per job step in its spool directory, and a socket's path holds at most
    107 bytes: under a deep root (pytest -n adds a directory level) every job failed to launch."""
    root = tmp_path / ("deep-" * 12) / "slurm"
    cluster = start_slurm(root, nodes=2)
    try:
        assert len(str(root / "spool" / "n1" / "n1_1.4294967291")) > 107  # the case in question
        done = subprocess.run(
            ["sbatch", "--parsable", "--wait", "-N", "2", "-o", str(root / "out.txt"), "--wrap", "srun hostname"],
            env=cluster.env(), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert len((root / "out.txt").read_text().split()) == 2  # one line per node
    finally:
        cluster.stop()
    assert not cluster.sockets.exists()
