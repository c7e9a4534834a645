"""examples/train/train.py on every Slurm the suites run on (``site``: this host's 22.05 with the local
transport, 24.11 and 26.05 in Debian roots reached over ssh as a login node), through the CLI: two ranks
meet at MASTER_ADDR (the first node's NodeAddr) and train; a job of the higher-tier partition preempts it
after a checkpoint (PreemptMode=REQUEUE: SIGTERM, then SIGKILL after KillWait); the supervisor of
`dispatch run` requeues it and incarnation 2 resumes from the checkpoint written on SIGTERM, ending with
the loss of a run never interrupted. Then a stale incarnation 1, started by hand on a node, is fenced.

The job file is examples/train/job.yaml made fit for Slurm (docs/slurm-configuration.md, "A job file
written for Kubernetes"): the same command and checkpointing, without the Kubernetes-only extensions (an
image needs pyxis here, a runtime Kubeflow: the example itself is refused, naming them); the program where
every node sees it, on the cluster's shared workdir (a root's nodes see only the root and the cluster's
own directory, bind-mounted at the same path, not this checkout), and run by a Python with numpy (the
roots' python3 with the recipe's python3-numpy; on 22.05, whose nodes are this host, this interpreter);
the checkpoint directory under the shared workdir."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from slurm_fixtures import Site

from train.trainlog import (  # tests/train: how the other training tests read the program
    Run,
    free_port,
    until_checkpoint,
)

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
EXAMPLE = ROOT / "examples" / "train" / "job.yaml"
WAIT = 120.0
"""A hang guard for waits on output, never a measure."""


class Program:
    """The training program as the site's nodes run it: its Python, and a copy on the shared workdir."""

    def __init__(self, site: Site, tmp_path: Path) -> None:
        self.site = site
        place = Path(site.cluster.workdir) / "train" / tmp_path.name  # one per test: one cluster serves many
        place.mkdir(parents=True)
        shutil.copy(ROOT / "examples" / "train" / "train.py", place / "train.py")
        self.path = str(place / "train.py")
        self.checkpoints = place / "checkpoints"
        self.python = sys.executable if site.version == "22.05" else "python3"

    def job(self, tmp_path: Path) -> tuple[Path, int, int]:
        """The example's job file for this site; its ``--checkpoint-every`` and ``--steps``."""
        spec = yaml.safe_load(EXAMPLE.read_text())
        command = list(spec["command"])
        assert command[:2] == ["python3", "examples/train/train.py"], command
        spec["command"] = [self.python, self.path, *command[2:]]
        spec["extensions"] = {"dispatch/SharedCheckpoint": {"dir": str(self.checkpoints)}}
        path = tmp_path / "train-slurm.yaml"
        path.write_text(yaml.safe_dump(spec))
        return path, int(command[command.index("--checkpoint-every") + 1]), int(command[command.index("--steps") + 1])  # fmt: skip

    def uninterrupted(self, steps: int, k: int) -> Run:
        """Both ranks of a run never interrupted, at full speed, on the login node (the cluster's own
        Python and numpy, as its nodes run it): rank 0's output."""
        script = (
            'export WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$3" DISPATCH_CHECKPOINT_DIR="$4"\n'
            'RANK=1 "$1" "$2" --steps "$5" --checkpoint-every "$6" >/dev/null &\n'
            'RANK=0 "$1" "$2" --steps "$5" --checkpoint-every "$6"; zero=$?\n'
            "wait $!; one=$?\n"
            'exit $(( zero || one ))\n'
        )  # fmt: skip
        done = self.site.cluster.run(
            "sh", "-c", script, "reference", self.python, self.path, str(free_port()),
            str(self.checkpoints.parent / "reference"), str(steps), str(k), timeout=WAIT,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return Run.of(done.stdout.splitlines())


def _config(tmp_path: Path, site: Site) -> Path:
    config = {
        "adapter": "slurm",
        "settings": site.settings(),
        "policy": {"rules": {"preempted": {"action": "requeue", "max": 3, "backoff": 1}}, "default": "fail"},
    }
    path = tmp_path / "slurm-cluster.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    return path


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


def _lines(cli: Cli, job: str, *more: str) -> list[str]:
    done = cli.run("logs", job, "--node", "0", *more)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in directory.iterdir()}


def test_the_kubernetes_job_file_is_refused_naming_each_extension_and_what_slurm_accepts(
    tmp_path: Path, site: Site
) -> None:
    cli = Cli(tmp_path, _config(tmp_path, site))
    done = cli.run("submit", "--dry-run", "examples/train/job.yaml")
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert 'examples/train/job.yaml: extensions["dispatch/Image"]: this cluster runs jobs without containers' in done.stderr, lines  # fmt: skip
    runtime = next(line for line in lines if 'extensions["kubeflow/RuntimeRef"]' in line)
    assert "examples/train/job.yaml: " in runtime and "Kubernetes" in runtime, runtime
    assert "accepts dispatch/SharedCheckpoint" in runtime, runtime
    assert "Traceback" not in done.stderr
    listed = cli.run("list", "-o", "name")
    assert listed.returncode == 0 and listed.stdout == "", listed  # nothing was submitted


def test_the_training_job_is_preempted_on_slurm_and_resumes_to_the_same_loss(
    tmp_path: Path, site: Site
) -> None:
    program = Program(site, tmp_path)
    job, k, steps = program.job(tmp_path)
    cli = Cli(tmp_path, _config(tmp_path, site))
    reference = program.uninterrupted(steps, k)
    assert [s for s, _ in reference.steps] == list(range(1, steps + 1))

    run = cli.start("run", str(job), "--job-id", "train-resumes")
    try:
        deadline = time.monotonic() + WAIT
        while cli.run("--json", "status", "train-resumes").returncode != 0:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        follow = cli.start("logs", "train-resumes", "--follow", "--node", "0")
        lines = until_checkpoint(follow, k)
        assert follow.stdout is not None
        ref = json.loads(cli.run("--json", "status", "train-resumes").stdout)["handle"]["ref"]
        nodes = site.slurm("squeue", "-h", "-j", str(ref), "-o", "%N").strip()
        site.cluster.preempt(site.slurm("scontrol", "show", "hostnames", nodes).split()[0])
        lines += [line.rstrip("\n") for line in follow.stdout]
        follow.wait(timeout=WAIT)
        out, err = run.communicate(timeout=500)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out + err
    assert "failed  (preempted)" in out and "outcome: succeeded / none  (train-resumes@2.1)" in out, out
    # The ranks met at node 0's NodeAddr (a NodeName, n1, resolves nowhere).
    assert any(line.startswith("rank 0 of 2") and "rank 0 at 127.0.0.1:" in line for line in lines), lines
    before = Run.of(lines)
    reached = before.reached
    assert k <= reached < steps
    assert before.checkpoints[-1] == reached, lines  # Slurm's SIGTERM came first: rank 0 checkpointed
    after = Run.of(_lines(cli, "train-resumes"))
    assert after.resumed_from == reached
    assert after.first - 1 >= k and after.first < reached + k
    assert after.reached == steps
    assert after.final_loss == reference.final_loss  # to the float
    assert "requeue 1 of 3 under rule preempted" in cli.run("history", "train-resumes").stdout
    # `logs` reads the current incarnation only; incarnation 1's files stay in its directory, as it says.
    earlier = cli.run("logs", "train-resumes", "--epoch", "1")
    assert earlier.returncode == 1 and "Slurm keeps the output files" in earlier.stderr, earlier.stderr
    (kept,) = Path(site.cluster.workdir).glob("d-train-resumes-1-*/node-0.out")
    assert f"stopping after step {reached}" in kept.read_text()

    # Fencing on the cluster's shared filesystem: incarnation 1, started again by hand on a node (an old
    # process someone left, or restarted), finds incarnation 2's checkpoints, refuses and writes nothing.
    own = program.checkpoints / "train-resumes"
    written = _digests(own)
    assert any(name.startswith("ckpt-e000002-") for name in written), written
    stale_out = Path(program.path).parent / "stale.out"
    wrap = shlex.join(
        ["env", "DISPATCH_EPOCH=1.0", "DISPATCH_JOB_ID=train-resumes", f"DISPATCH_CHECKPOINT_DIR={program.checkpoints}",
         program.python, program.path, "--steps", str(steps), "--checkpoint-every", str(k)]
    )  # fmt: skip
    stale = site.cluster.run(
        "sbatch", "--wait", "-N", "1", "-o", str(stale_out), "--wrap", wrap, timeout=WAIT
    )
    said = stale_out.read_text() if stale_out.exists() else "(no output file)"
    assert stale.returncode == 3, stale.stdout + stale.stderr + said  # sbatch --wait: the job's exit code
    assert "fenced: incarnation 2 has written checkpoints" in said, said
    assert _digests(own) == written
