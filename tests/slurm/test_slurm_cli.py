"""The command line on the real local Slurm with a config file naming the adapter ``slurm``: the
quick start's hello job, a refused image, and a supervised requeue after a preemption that succeeds at
incarnation 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch_slurm.localslurm import LocalSlurm

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def config(tmp_path: Path, slurm: LocalSlurm, *, scripts: bool = True) -> Path:
    path = tmp_path / "slurm-cluster.yaml"
    path.write_text(
        "adapter: slurm\n"
        "settings:\n"
        f"  slurmConf: {slurm.conf}\n"
        f"  workdir: {slurm.workdir}\n"
        "  pollInterval: 500ms\n"
        f"  behaviourScripts: {'true' if scripts else 'false'}\n"
        "policy:\n"
        "  rules:\n"
        "    preempted: {action: requeue, max: 3, backoff: 1}\n"
        "  default: fail\n"
    )
    return path


def dispatch(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
    env.update(DISPATCH_STATE_DIR=str(tmp_path / "state"), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    return subprocess.run(
        ["dispatch", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False
    )


def test_hello_runs_on_slurm(tmp_path: Path, slurm: LocalSlurm) -> None:
    done = dispatch(tmp_path, "run", "examples/hello.yaml", "--config", str(config(tmp_path, slurm)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "outcome: succeeded / none" in done.stdout
    assert "SlurmJob/" in done.stdout and "COMPLETED exit code 0" in done.stdout


def test_an_image_without_a_container_plugin_is_refused_with_the_reason(
    tmp_path: Path, slurm: LocalSlurm
) -> None:
    cfg = str(config(tmp_path, slurm, scripts=False))
    done = dispatch(tmp_path, "submit", "--dry-run", "examples/hello.yaml", "--config", cfg)
    assert done.returncode != 0
    assert "dispatch/Image" in done.stderr and "without containers" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_dry_run_shows_the_sbatch_script(tmp_path: Path, slurm: LocalSlurm) -> None:
    job = tmp_path / "job.yaml"
    job.write_text("command: [python3, train.py]\nnodes: 2\ntimeLimit: 90\n")
    done = dispatch(tmp_path, "submit", "--dry-run", str(job), "--config", str(config(tmp_path, slurm)))
    assert done.returncode == 0, done.stderr
    for line in ("#SBATCH --nodes=2", "#SBATCH --time=2", "#SBATCH --no-requeue", "srun", "train.py"):
        assert line in done.stdout, done.stdout


def test_a_preempted_job_is_requeued_and_succeeds_at_incarnation_2(tmp_path: Path, slurm: LocalSlurm) -> None:
    done = dispatch(
        tmp_path,
        "run",
        "examples/preempted.yaml",
        "--job-id",
        "pre-1",
        "--config",
        str(config(tmp_path, slurm)),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "pre-1@1.0" in out and "PREEMPTED" in out and "failed  (preempted)" in out, out
    assert "outcome: succeeded / none  (pre-1@2.1)" in out, out


def test_logs_of_a_finished_two_node_job_print_each_node(tmp_path: Path, slurm: LocalSlurm) -> None:
    """`dispatch logs` printed node 0, then "there is no node 1" (exit 1) once the job had ended: the
    node count came from a reading the ended job no longer had (24.11)."""
    job = tmp_path / "two.yaml"
    job.write_text("command: [sh, -c, 'echo hello from $NODE_RANK']\nnodes: 2\n")
    cfg = str(config(tmp_path, slurm, scripts=False))
    done = dispatch(tmp_path, "run", str(job), "--job-id", "two-nodes", "--config", cfg)
    assert done.returncode == 0, done.stdout + done.stderr
    logs = dispatch(tmp_path, "logs", "two-nodes", "--config", cfg)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert logs.stdout.splitlines() == ["[node 0] hello from 0", "[node 1] hello from 1"], logs.stdout
