"""A fleet of two real clusters in one config (SPEC §15, docs/fleet.md): this host's Slurm 22.05 and the dev
cluster in the processes mode, through the CLI.

- The training example starts on Slurm (first in the fleet's order), is preempted there after a
  checkpoint, and the policy's ``elsewhere`` requeues it onto the Kubeflow cluster, where incarnation 2
  resumes from the checkpoint incarnation 1 wrote on SIGTERM and ends with the loss of a run never
  interrupted: both clusters see the checkpoint directory (the same path on both: the dev cluster's
  checkpoint volume is a directory of this host, and Slurm 22.05's nodes are this host). ``history`` and
  the page name both clusters.
- With Slurm's controller down, a new job goes to Kubeflow, a job on Slurm waits unchanged (shown as last
  known, never ``lost``), and a job that may only go to Slurm (``--cluster slurm``) waits for it, then
  runs there once the controller is back.

One job file serves both clusters: no image and no runtime (Slurm refuses both); the Kubeflow cluster's
settings name them (``defaultImage``, ``defaultRuntime``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dispatch_slurm.localslurm import LocalSlurm
from train.trainlog import Run, ranks

pytestmark = pytest.mark.timeout(900)
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PROGRAM = ROOT / "examples" / "train" / "train.py"
K, STEPS = 10, 100
WAIT = 180.0
"""A hang guard for waits on a state or a line, never a measure."""


class Fleet:
    """The CLI over the fleet's config, with its own state directory (whose dev cluster it starts)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "KUBECONFIG", "TRAIN_"))
        }
        self.env["DISPATCH_STATE_DIR"] = str(home / "state")
        self.env["PATH"] = f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"  # python3 with numpy
        self.config = home / "fleet.yaml"

    def cli(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "dispatch"), *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.cli("--config", str(self.config), *args)

    def start(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(BIN / "dispatch"), "--config", str(self.config), *args],
            cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip

    def kubectl(self, *args: str) -> str:
        kubeconfig = self.home / "state" / "dev-cluster" / "kubeconfig"
        done = subprocess.run(
            [str(BIN / "kubectl"), "--kubeconfig", str(kubeconfig), *args], capture_output=True, text=True, timeout=60
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    def status(self, job: str) -> dict[str, object]:
        done = self.run("--json", "status", job)
        assert done.returncode == 0, done.stdout + done.stderr
        return dict(json.loads(done.stdout))

    def until(self, job: str, what: str, test: object) -> dict[str, object]:
        """The job's status once ``test(status)`` holds (polled; ``what`` names it for a failure)."""
        deadline = time.monotonic() + WAIT
        while True:
            status = self.status(job)
            if test(status):  # type: ignore[operator]
                return status
            assert time.monotonic() < deadline, f"{job}: not {what} within {WAIT:g} s: {status}"
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
        assert shared.startswith("/") and Path(shared).is_dir(), shared
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
                        "kubeconfig": str(f.home / "state" / "dev-cluster" / "kubeconfig"),
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
        fleet.until("across", "running on Slurm", lambda s: s["state"] == "running")
        follow = fleet.start("logs", "across", "--follow", "--node", "0")
        assert follow.stdout is not None
        lines = []
        for line in follow.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith(f"checkpoint step {K} epoch 1: "):
                break
        else:
            raise AssertionError("\n".join(lines))
        ref = fleet.status("across")["handle"]["ref"]  # type: ignore[index]
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


def _answers(slurm: LocalSlurm) -> bool:
    return slurm.run("squeue", "-h", timeout=30).returncode == 0


def test_with_slurms_controller_down_new_jobs_go_to_kubeflow_and_slurms_jobs_wait(
    fleet: Fleet, slurm: LocalSlurm
) -> None:
    sleep = _job(fleet, "sleep", ["sleep", "600"])
    hello = _job(fleet, "hello", ["echo", "hello"])
    done = fleet.run("submit", str(sleep), "--job-id", "stays", "--cluster", "slurm")
    assert done.returncode == 0, done.stdout + done.stderr
    running = fleet.until("stays", "running", lambda s: s["state"] == "running")
    slurm.kill_controller()
    try:
        # A new job is placed on Kubeflow: Slurm does not answer.
        done = fleet.run("submit", str(hello), "--job-id", "elsewhere")
        assert done.returncode == 0, done.stdout + done.stderr
        assert fleet.status("elsewhere")["clusterName"] == "k8s"
        placed = fleet.run("history", "elsewhere").stdout
        assert "placed on k8s" in placed and "passed over slurm: unreachable" in placed, placed
        # A job that may only go to Slurm waits for it, on it.
        done = fleet.run("submit", str(hello), "--job-id", "waits", "--cluster", "slurm")
        assert done.returncode == 0, done.stdout + done.stderr
        waiting = fleet.status("waits")
        assert (waiting["state"], waiting["clusterName"]) == ("pending", "slurm"), waiting
        # Slurm's job is as last read: never concluded from the silence.
        shown = fleet.run("status", "stays")
        assert shown.returncode == 0, shown.stderr
        assert "shown as last known" in shown.stdout + shown.stderr, shown
        now = fleet.status("stays")
        assert (now["state"], now["epoch"], now["handle"]) == (
            running["state"],
            running["epoch"],
            running["handle"],
        )
    finally:
        slurm.start_controller()
    deadline = time.monotonic() + WAIT
    while not _answers(slurm):
        assert time.monotonic() < deadline, "slurmctld did not answer again"
        time.sleep(0.5)
    supervise = fleet.start("supervise")
    try:
        ran = fleet.until("waits", "succeeded", lambda s: s["state"] == "succeeded")
        assert ran["clusterName"] == "slurm", ran
        assert fleet.status("elsewhere")["state"] == "succeeded"
        assert fleet.status("stays")["state"] == "running"  # the controller's restart ended nothing
    finally:
        supervise.terminate()
        supervise.communicate(timeout=60)
        fleet.run("cancel", "stays", "--wait")
