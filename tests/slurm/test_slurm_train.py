"""examples/train/train.py on the real local Slurm (this machine's, 22.05 on Debian bookworm), through the
CLI: two ranks meet at MASTER_ADDR (the first node's NodeAddr) and train; a job of the higher-tier
partition preempts it after a checkpoint (PreemptMode=REQUEUE: SIGTERM, then SIGKILL after KillWait); the
supervisor of `dispatch run` requeues it and incarnation 2 resumes from the checkpoint written on SIGTERM,
ending with the loss of a run never interrupted.

The job file is examples/train/job.yaml made fit for this cluster: the same command and checkpointing, with
the program's absolute path (Slurm runs the command in the incarnation's directory), the checkpoint
directory under the shared workdir, and without the Kubernetes-only extensions (an image needs pyxis here,
a runtime Kubeflow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from dispatch_slurm.localslurm import LocalSlurm
from train.trainlog import Run  # tests/train: how the other training tests read the program's output

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
WAIT = 120.0
"""A hang guard for waits on output, never a measure."""


def _config(tmp_path: Path, slurm: LocalSlurm) -> Path:
    path = tmp_path / "slurm-cluster.yaml"
    path.write_text(
        "adapter: slurm\n"
        "settings:\n"
        f"  slurmConf: {slurm.conf}\n"
        f"  workdir: {slurm.workdir}\n"
        "  pollInterval: 500ms\n"
        "policy:\n"
        "  rules:\n"
        "    preempted: {action: requeue, max: 3, backoff: 1}\n"
        "  default: fail\n"
    )
    return path


def _job(tmp_path: Path, slurm: LocalSlurm) -> tuple[Path, int, int]:
    """The example's job file for this cluster; its ``--checkpoint-every`` and ``--steps``."""
    spec = yaml.safe_load((ROOT / "examples" / "train" / "job.yaml").read_text())
    command = list(spec["command"])
    command[0] = sys.executable  # with numpy, whatever python3 Slurm's PATH finds
    command[1] = str(ROOT / command[1])
    spec["command"] = command
    spec["extensions"] = {"dispatch/SharedCheckpoint": {"dir": f"{slurm.workdir}/checkpoints"}}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(spec))
    return (
        path,
        int(command[command.index("--checkpoint-every") + 1]),
        int(command[command.index("--steps") + 1]),
    )


class Cli:
    def __init__(self, tmp_path: Path, config: Path) -> None:
        self.config = str(config)
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "TRAIN_"))}
        self.env.update(
            DISPATCH_STATE_DIR=str(tmp_path / "state"), PATH=f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"
        )

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["dispatch", *args, "--config", self.config],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            ["dispatch", *args, "--config", self.config], cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )  # fmt: skip


def _lines(cli: Cli, job: str) -> list[str]:
    done = cli.run("logs", job, "--node", "0")
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_training_job_is_preempted_on_slurm_and_resumes_to_the_same_loss(
    tmp_path: Path, slurm: LocalSlurm
) -> None:
    job, k, steps = _job(tmp_path, slurm)
    cli = Cli(tmp_path, _config(tmp_path, slurm))
    plain = cli.run("run", str(job), "--job-id", "plain")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    uninterrupted = Run.of(_lines(cli, "plain"))
    assert [s for s, _ in uninterrupted.steps] == list(range(1, steps + 1))
    assert any(
        line.startswith("rank 0 of 2") and "rank 0 at 127.0.0.1:" in line for line in _lines(cli, "plain")
    )

    run = cli.start("run", str(job), "--job-id", "preempted")
    try:
        deadline = time.monotonic() + WAIT
        while cli.run("--json", "status", "preempted").returncode != 0:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        follow = cli.start("logs", "preempted", "--follow", "--node", "0")
        assert follow.stdout is not None
        lines = []
        for line in follow.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith(f"checkpoint step {k} epoch 1: "):
                break
        else:
            raise AssertionError("\n".join(lines))
        ref = json.loads(cli.run("--json", "status", "preempted").stdout)["handle"]["ref"]
        nodes = subprocess.run(
            [slurm._bin("squeue"), "-h", "-j", str(ref), "-o", "%N"], env=slurm.env(), capture_output=True, text=True, check=True
        ).stdout.strip()  # fmt: skip
        first = subprocess.run(
            [slurm._bin("scontrol"), "show", "hostnames", nodes], env=slurm.env(), capture_output=True, text=True, check=True
        ).stdout.split()[0]  # fmt: skip
        slurm.preempt(first)
        lines += [line.rstrip("\n") for line in follow.stdout]
        follow.wait(timeout=WAIT)
        out, err = run.communicate(timeout=500)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out + err
    assert "failed  (preempted)" in out and "outcome: succeeded / none  (preempted@2.1)" in out, out
    before = Run.of(lines)
    reached = before.reached
    assert k <= reached < steps
    assert before.checkpoints[-1] == reached, lines  # Slurm's SIGTERM came first: rank 0 checkpointed
    after = Run.of(_lines(cli, "preempted"))
    assert after.resumed_from == reached
    assert after.first - 1 >= k and after.first < reached + k
    assert after.final_loss == uninterrupted.final_loss
