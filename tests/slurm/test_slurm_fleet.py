"""The training example across a fleet of two real clusters in one config (SPEC §15, docs/fleet.md): this host's Slurm 22.05 and the dev
cluster in the processes mode, through the CLI.

- The training example starts on Slurm (first in the fleet's order), is preempted there after a
  checkpoint, and the policy's ``elsewhere`` requeues it onto the Kubeflow cluster, where incarnation 2
  resumes from the checkpoint incarnation 1 wrote on SIGTERM and ends with the loss of a run never
  interrupted: both clusters see the checkpoint directory (the same path on both: the dev cluster's
  checkpoint volume is a directory of this host, and Slurm 22.05's nodes are this host). ``history`` names
  both clusters and says the checkpoints follow.

``test_slurm_fleet_cli.py`` has the rest of issue 39's Done-when on the same two clusters (behaviour
scripts: the page's two bars, Slurm's controller down).

One job file serves both clusters: no image and no runtime (Slurm refuses both); the Kubeflow cluster's
settings name them (``defaultImage``, ``defaultRuntime``)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from dispatch_slurm.localslurm import LocalSlurm
from train.trainlog import Run, Session, ranks, until_checkpoint

pytestmark = pytest.mark.timeout(900)
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PROGRAM = ROOT / "examples" / "train" / "train.py"
K, STEPS = 10, 100
WAIT = 180.0
"""A hang guard for waits on a state or a line, never a measure."""


class Fleet(Session):
    """The CLI over the fleet's config, with its own state directory (whose dev cluster it starts)."""

    def __init__(self, home: Path) -> None:
        super().__init__(home)
        self.config = home / "fleet.yaml"

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """A command without the fleet's config (the dev cluster's own)."""
        return super().run(*args, timeout=timeout)

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return super().run("--config", str(self.config), *args, timeout=timeout)

    def start(self, *args: str) -> subprocess.Popen[str]:
        return super().start("--config", str(self.config), *args)

    def status(self, job: str) -> dict[str, Any]:
        done = self.run("--json", "status", job)
        assert done.returncode == 0, done.stdout + done.stderr
        return dict(json.loads(done.stdout))

    def until(
        self,
        job: str,
        what: str,
        test: Callable[[dict[str, Any]], bool],
        run: subprocess.Popen[str] | None = None,
    ) -> dict[str, Any]:
        """The job's status once ``test(status)`` holds (polled, the job perhaps not submitted yet; ``what``
        names it for a failure; ``run``: the command that submits it, which must not end first)."""
        deadline = time.monotonic() + WAIT
        while True:
            done = self.run("--json", "status", job)
            if done.returncode == 0:
                status = dict(json.loads(done.stdout))
                if test(status):
                    return status
            if run is not None and run.poll() is not None:
                raise AssertionError(f"{job}: the run ended first: {run.communicate()}")
            assert time.monotonic() < deadline, (
                f"{job}: not {what} within {WAIT:g} s: {done.stdout}{done.stderr}"
            )
            time.sleep(0.3)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, slurm: LocalSlurm) -> Iterator[Fleet]:
    f = Fleet(tmp_path_factory.mktemp("fleet"))
    started = f.cli("dev-cluster", "start", "--processes", "--json")
    assert started.returncode == 0, started.stderr
    try:
        # The checkpoint volume's directory on this host: the dev cluster maps the claim's mounts to it, and
        # mounted at that same path, a job's checkpoint dir is one path on both clusters.
        volume = f.kubectl("get", "pvc", "dispatch-checkpoints", "-o", "jsonpath={.spec.volumeName}")
        shared = f.kubectl("get", "pv", volume, "-o", "jsonpath={.spec.hostPath.path}")
        assert shared.startswith("/"), shared  # made when a pod first mounts it, or a Slurm job writes in it
        config = {
            "clusters": {
                "slurm": {
                    "adapter": "slurm",
                    "settings": {**slurm.settings(), "pollInterval": "500ms"},
                    "checkpoints": "this-host",
                    "store": {"sqlite": str(f.home / "jobs.db")},
                    "policy": {
                        "rules": {
                            "preempted": {"action": "requeue", "max": 3, "backoff": 1, "elsewhere": True}
                        },
                        "default": "fail",
                    },
                },
                "k8s": {
                    "adapter": "kubeflow",
                    "settings": {
                        "kubeconfig": str(f.kubeconfig),
                        "checkpointVolume": {"claimName": "dispatch-checkpoints", "mountPath": shared},
                        "defaultImage": "dispatch-train:1",
                        "defaultRuntime": {"kind": "ClusterTrainingRuntime", "name": "dispatch-torch"},
                    },
                    "checkpoints": "this-host",
                },
            },
            "placement": {"order": ["slurm", "k8s"]},
        }
        f.config.write_text(yaml.safe_dump(config))
        f.shared = Path(shared)  # type: ignore[attr-defined]
        yield f
    finally:
        f.cli("dev-cluster", "stop", timeout=60)


def _job(fleet: Fleet, name: str, command: list[str], nodes: int = 1) -> Path:
    spec = {
        "command": command,
        "nodes": nodes,
        "extensions": {"dispatch/SharedCheckpoint": {"dir": str(fleet.shared / "train")}},  # type: ignore[attr-defined]
    }
    path = fleet.home / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _uninterrupted(tmp_path: Path) -> Run:
    args = ["--steps", str(STEPS), "--checkpoint-every", str(K)]
    procs = ranks(2, args, ROOT, extra={"DISPATCH_CHECKPOINT_DIR": str(tmp_path / "reference")})
    codes = [p.finish() for p in procs]
    assert codes == [0, 0], procs[0].output()
    return procs[0].run()


def test_preempted_on_slurm_the_training_resumes_on_kubeflow_from_its_checkpoint(
    fleet: Fleet, slurm: LocalSlurm, tmp_path: Path
) -> None:
    reference = _uninterrupted(tmp_path)
    train = [
        sys.executable,
        str(PROGRAM),
        "--steps",
        str(STEPS),
        "--checkpoint-every",
        str(K),
        "--step-time",
        "0.1",
    ]
    job = _job(fleet, "train", train, nodes=2)
    run = fleet.start("run", str(job), "--job-id", "across")
    try:
        fleet.until(
            "across", "running on Slurm", lambda s: s.get("outcome", {}).get("state") == "running", run
        )
        follow = fleet.start("logs", "across", "--follow", "--node", "0")
        lines = until_checkpoint(follow, K)
        assert follow.stdout is not None
        ref = fleet.status("across")["handle"]["ref"]
        nodes = slurm.run("squeue", "-h", "-j", str(ref), "-o", "%N").stdout.strip()
        slurm.preempt(slurm.run("scontrol", "show", "hostnames", nodes).stdout.split()[0])
        lines += [line.rstrip("\n") for line in follow.stdout]
        follow.wait(timeout=WAIT)
        out, err = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out + err
    assert "outcome: succeeded / none  (across@2.1)" in out, out
    before = Run.of(lines)
    reached = before.reached
    assert K <= reached < STEPS and before.checkpoints[-1] == reached, lines  # checkpointed on SIGTERM
    done = fleet.run("logs", "across", "--node", "0")
    assert done.returncode == 0, done.stderr
    after = Run.of(done.stdout.splitlines())
    assert after.resumed_from == reached
    assert after.reached == STEPS and after.final_loss == reference.final_loss  # to the float

    history = fleet.run("history", "across")
    assert history.returncode == 0, history.stderr
    text = history.stdout
    assert re.search(r"across@1\.0 .*started\s+on slurm", text), text
    assert re.search(r"across@2\.1 .*started\s+on k8s", text), text
    assert "its checkpoints follow (slurm and k8s see this-host)" in text, text
    assert (
        "1 (across@1.0): failed / preempted on slurm" in text
        and "2 (across@2.1): succeeded / none on k8s" in text
    ), text
