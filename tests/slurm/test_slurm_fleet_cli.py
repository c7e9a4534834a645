"""A fleet of a real Slurm (22.05, the ``slurm`` fixture) and a Kubernetes cluster (``python -m kubesim
serve``, its own process) through the command line, as issue 39's Done-when says (SPEC §15): a job
preempted on Slurm is requeued onto Kubeflow and succeeds there, ``history`` names both clusters and the
page draws both bars; with Slurm's controller down a new job goes to Kubeflow, a Slurm job waits unchanged
(shown as last known), and one that may only go to Slurm (``--cluster slurm``) waits for it.

Real processes throughout: ``dispatch`` as a subprocess, Slurm's daemons, kubesim over HTTP.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dispatch_slurm.localslurm import LocalSlurm

pytestmark = pytest.mark.timeout(600)
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ELSEWHERE = {"rules": {"preempted": {"action": "requeue", "max": 2, "backoff": 1, "elsewhere": True}}}
SLEEPER = """\
command: [python, -m, train]
env: {KUBESIM_SCRIPT: "print waiting; sleep 600; exit 0"}
extensions:
  dispatch/Image: {ref: "example.org/train:1"}
  kubeflow/RuntimeRef: {kind: ClusterTrainingRuntime, name: dispatch-torch}
"""


class Fleet:
    """The fleet config (``slurm`` first, then ``k8s``) and ``dispatch`` run on it."""

    def __init__(self, home: Path, slurm: LocalSlurm, kubeconfig: Path) -> None:
        self.home = home
        config = {
            "clusters": {
                "slurm": {
                    "adapter": "slurm",
                    # behaviourScripts: the job's KUBESIM_SCRIPT runs for real on Slurm's nodes
                    # (examples/slurm-cluster.yaml says why), so Slurm preempts it as kubesim would.
                    "settings": {**slurm.settings(), "pollInterval": "500ms", "behaviourScripts": True},
                    "store": {"sqlite": str(home / "jobs.db")},
                    "policy": ELSEWHERE,
                },
                "k8s": {
                    "adapter": "kubeflow",
                    "settings": {"kubeconfig": str(kubeconfig), "namespace": "default"},
                },
            },
            "placement": {"order": ["slurm", "k8s"]},
        }
        self.config = home / "fleet.json"
        self.config.write_text(json.dumps(config, indent=1))
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
        self.env.update(DISPATCH_STATE_DIR=str(home / "state"), DISPATCH_CONFIG=str(self.config))

    def __call__(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "dispatch"), *args], cwd=ROOT, env=self.env, capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip

    def json(self, *args: str) -> Any:
        done = self(*args, "-o", "json")
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)


@pytest.fixture
def fleet(tmp_path: Path, slurm: LocalSlurm) -> Iterator[Fleet]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubesim", "serve", "--kubeconfig", str(tmp_path / "k8s.kubeconfig"),
         "--speed", "4", "--no-kueue"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        while "kubeconfig written" not in proc.stdout.readline():
            assert proc.poll() is None, "kubesim serve exited early"
        yield Fleet(tmp_path, slurm, tmp_path / "k8s.kubeconfig")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_a_job_preempted_on_slurm_is_requeued_onto_kubeflow_and_succeeds_there(fleet: Fleet) -> None:
    ran = fleet("run", "examples/preempted.yaml", "--job-id", "moved")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "started  on slurm" in ran.stdout and "started  on k8s" in ran.stdout, ran.stdout
    assert "outcome: succeeded / none  (moved@2.1)" in ran.stdout, ran.stdout
    history = fleet("history", "moved")
    assert history.returncode == 0, history.stderr
    assert "placed on k8s: the first other cluster that takes it; passed over slurm" in history.stdout
    incarnations = history.stdout.split("incarnations:\n", 1)[1].splitlines()
    assert incarnations[0].startswith("  1 (moved@1.0): failed / preempted on slurm"), incarnations
    assert incarnations[1] == "  2 (moved@2.1): succeeded / none on k8s", incarnations
    # The page draws both bars, each naming its cluster (tests/ui/test_fleet_page.py looks in chromium).
    page = subprocess.Popen(
        [str(BIN / "dispatch"), "ui", "--address", "127.0.0.1:0"],
        env=fleet.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert page.stdout is not None
        first = page.stdout.readline()
        url = re.search(r"serving the page at (http://\S+)", first)
        assert url, first
        with urllib.request.urlopen(url.group(1) + "jobs/moved", timeout=60) as got:
            html = got.read().decode()
    finally:
        page.send_signal(signal.SIGTERM)
        page.wait(timeout=30)
    bars = re.findall(r'<g class="bar" data-epoch="([^"]+)"[^>]*data-cluster="([^"]+)"', html)
    assert bars == [("1.0", "slurm"), ("2.1", "k8s")], bars
    rows = {r["name"]: r for r in fleet.json("clusters")}
    assert rows["slurm"]["reachable"] and rows["k8s"]["reachable"]
    assert (rows["slurm"]["jobs"], rows["k8s"]["jobs"]) == (0, 1)  # its current incarnation is on k8s


def test_with_slurms_controller_down_new_jobs_go_to_kubeflow_and_slurms_wait(
    fleet: Fleet, slurm: LocalSlurm
) -> None:
    job = fleet.home / "sleeper.yaml"
    job.write_text(SLEEPER)
    before = fleet("submit", str(job), "--job-id", "on-slurm", "--cluster", "slurm")
    assert before.returncode == 0, before.stdout + before.stderr
    was = fleet.json("status", "on-slurm")
    assert was["clusterName"] == "slurm"
    slurm.kill_controller()  # once its state is saved: the restarted one knows the job
    try:
        went = fleet("submit", str(job), "--job-id", "new")
        assert went.returncode == 0, went.stdout + went.stderr
        rec = fleet.json("status", "new")
        assert rec["clusterName"] == "k8s", rec
        said = fleet("history", "new").stdout
        assert "placed on k8s: the first that takes it; passed over slurm: unreachable" in said, said

        status = fleet("status", "on-slurm")
        assert status.returncode == 0, status.stderr
        assert "cluster: slurm: cluster slurm unreachable since" in status.stdout, status.stdout
        assert "shown as last known" in status.stdout
        now = fleet.json("status", "on-slurm")
        assert (now["outcome"], now["epoch"]) == (was["outcome"], was["epoch"])  # unchanged

        waits = fleet("submit", str(job), "--job-id", "only-slurm", "--cluster", "slurm")
        assert waits.returncode == 0, waits.stdout + waits.stderr
        pending = fleet("status", "only-slurm").stdout
        assert re.search(r"^state: +pending", pending, re.M) and "cluster slurm unreachable" in pending, (
            pending
        )
        assert "waits for slurm" in fleet("history", "only-slurm").stdout
    finally:
        slurm.start_controller()
    for jid in ("on-slurm", "new", "only-slurm"):  # nothing left running on either cluster
        fleet("cancel", jid)
