"""The embedded default (no config): Kubeflow on the dev cluster, as a new user meets it.

Real processes throughout: the ``dispatch`` console script, and the dev cluster it starts in the
background (``python -m kubesim serve``). One dev cluster (and one ≥ 10 s probe) serves the module; the
probe's findings are cached in the store, so every later command skips it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
README = (ROOT / "README.md").read_text()

LONG = """\
command: [python, -m, train]
nodes: 2
env: {KUBESIM_SCRIPT: "print working; sleep 600; exit 0"}
extensions:
  dispatch/Image: {ref: "example.org/train:1"}
  kubeflow/RuntimeRef: {kind: ClusterTrainingRuntime, name: torch-distributed}
"""


class Session:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("DISPATCH_")}
        self.env["DISPATCH_STATE_DIR"] = str(home / "state")
        self.env["PATH"] = f"{BIN}{os.pathsep}{self.env.get('PATH', '')}"

    @property
    def dev(self) -> Path:
        return self.home / "state" / "dev-cluster"

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.run("dev-cluster", "stop", timeout=30)  # whatever the test started

    def run(self, *args: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "dispatch"), *args],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def kubectl(self, *args: str) -> str:
        done = subprocess.run(
            [str(BIN / "kubectl"), "--kubeconfig", str(self.dev / "kubeconfig"), *args],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    with Session(tmp_path_factory.mktemp("embedded")) as s:
        yield s


def _readme_quick_start() -> list[str]:
    first = re.search(r"```sh\n(.*?)\n", README)
    assert first is not None
    last = first.group(1).split("&&")[-1].split()
    assert last[0] == ".venv/bin/dispatch", "the quick start ends by running dispatch from the venv"
    return last[1:]


@pytest.mark.timeout(600)
def test_the_readme_quick_start_runs_kubeflow_on_kubesim(session: Session) -> None:
    done = session.run(*_readme_quick_start())
    assert done.returncode == 0, done.stdout + done.stderr
    # The real path: the dev cluster starts (and says how to stop it), preflight probes, a TrainJob is
    # created under its name, and the outcome is typed, with evidence.
    assert "started the dev cluster" in done.stderr and "dispatch dev-cluster stop" in done.stderr
    assert "probe: creating a gated TrainJob" in done.stderr
    assert re.search(r"started .*kubeflow:default/job-[0-9a-f]+-1-", done.stdout)
    assert "outcome: succeeded / none" in done.stdout
    assert "evidence: TrainJob/" in done.stdout
    assert (session.home / "state" / "jobs.db").exists()
    assert "Traceback" not in done.stderr


@pytest.mark.timeout(600)
def test_later_commands_find_the_cluster_and_skip_the_probe(session: Session, tmp_path: Path) -> None:
    session.run("run", "examples/hello.yaml")  # the cluster and the probe's findings exist
    before = session.kubectl("get", "trainjobs", "-o", "name").split()
    done = session.run("--json", "submit", "examples/hello.yaml", "--job-id", "second")
    assert done.returncode == 0, done.stderr
    assert "probe: creating" not in done.stderr and "started the dev cluster" not in done.stderr
    after = session.kubectl("get", "trainjobs", "-o", "name").split()
    assert len(after) == len(before) + 1  # exactly one TrainJob: the job's own, no probe left over
    # How long it takes (no probe window) is measured in benchmarks/cli_bench.py, not asserted here.
    status = session.run("--json", "status", "second")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["jobId"] == "second"
    listed = session.run("list")
    assert "second" in listed.stdout and "lost" not in listed.stdout


@pytest.mark.timeout(600)
def test_ctrl_c_during_run_leaves_the_job_running_not_lost(session: Session, tmp_path: Path) -> None:
    session.run("dev-cluster", "start")
    job = tmp_path / "long.yaml"
    job.write_text(LONG)
    proc = subprocess.Popen(
        [str(BIN / "dispatch"), "run", str(job), "--job-id", "interrupted"],
        cwd=ROOT,
        env=session.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # wait until the TrainJob is created
        if " started " in line:
            break
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert "interrupted: job interrupted keeps running on the dev cluster" in err
    status = session.run("--json", "status", "interrupted")
    assert json.loads(status.stdout)["outcome"]["state"] in ("pending", "starting", "running")
    cancel = session.run("cancel", "interrupted")
    assert cancel.returncode == 0, cancel.stderr


@pytest.mark.timeout(600)
def test_a_record_whose_cluster_is_gone_says_so(session: Session, tmp_path: Path) -> None:
    job = tmp_path / "long.yaml"
    job.write_text(LONG)
    assert session.run("submit", str(job), "--job-id", "orphan").returncode == 0
    assert session.run("dev-cluster", "stop").returncode == 0
    assert session.run("dev-cluster", "status").returncode == 1
    status = session.run("status", "orphan")
    assert status.returncode == 0, status.stderr
    assert "cluster: gone: the dev cluster that ran it is not running" in status.stdout
    assert "lost" not in status.stdout
    listed = session.run("list")
    assert re.search(r"orphan\s+\S+ \(last known\)", listed.stdout), listed.stdout
    watched = session.run("watch", "orphan", timeout=30)
    assert watched.returncode == 1 and "cluster: gone" in watched.stdout  # 0 only for succeeded
    cancel = session.run("cancel", "orphan")
    assert cancel.returncode == 1 and "not running" in cancel.stderr
    assert "started the dev cluster" not in cancel.stderr  # a gone job starts nothing
    # A new dev cluster never had the job: still gone, never lost.
    assert session.run("dev-cluster", "start").returncode == 0
    again = session.run("--json", "status", "orphan")
    body = json.loads(again.stdout)
    assert body["outcome"]["state"] != "lost" and "was stopped" in body["lastKnown"]
    # Nor does the supervisor of the new dev cluster call it lost: it is not that cluster's job.
    for _ in range(2):  # a vanished TrainJob is believed lost on a second read
        supervised = session.run("supervise", "--once", "--poll", "0.1", "--lease", "5")
        assert supervised.returncode == 0, supervised.stderr
        # (the earlier test's cancelled job may still be converging, Trainer v2.3.0's stop, on the
        # stopped cluster too: the note names every job of it)
        note = re.search(
            r"left alone: \d+ job\(s\) of a dev cluster that is gone \(([^)]*)\)", supervised.stdout
        )
        assert note is not None and "orphan" in note.group(1).split(", "), supervised.stdout
    after = json.loads(session.run("--json", "status", "orphan").stdout)
    assert after["outcome"]["state"] == body["outcome"]["state"]
    # The user ends it: lost, by the user, with the reason; final, so no supervisor requeues it.
    forgot = session.run("forget", "--cluster-gone")
    assert forgot.returncode == 0 and "forget orphan@1.0: lost" in forgot.stdout, (
        forgot.stdout + forgot.stderr
    )
    history = session.run("history", "orphan").stdout
    assert re.search(r"user\s+forgotten\s+lost.*is gone", history), history
    assert "no job of a dev cluster that is gone" in session.run("forget", "--cluster-gone").stdout


def test_the_dev_cluster_writes_kubeconfigs_and_a_cluster_config(session: Session) -> None:
    done = session.run("dev-cluster", "start", "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout)
    assert Path(info["kubeconfig"]).stat().st_mode & 0o077 == 0  # it holds a token
    # The cluster config points at it with a relative kubeconfig, resolved from the file.
    check = session.run("--config", info["config"], "check", "--read-only")
    assert check.returncode == 0, check.stderr
    assert "mode:             read-only" in check.stdout
    if info["readonlyKubeconfig"]:
        denied = subprocess.run(
            [
                str(BIN / "kubectl"),
                "--kubeconfig",
                info["readonlyKubeconfig"],
                "auth",
                "can-i",
                "create",
                "trainjobs",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert denied.returncode != 0 and denied.stdout.strip() == "no", denied.stdout + denied.stderr
    assert shutil.which("kubectl", path=str(BIN))


@pytest.mark.timeout(600)
def test_a_read_command_asking_the_dev_cluster_imports_no_yaml_and_no_http_library(
    session: Session, tmp_path: Path
) -> None:
    """The structure behind a fast `status` of a running job (SPEC §11.1; the CPU is measured in
    benchmarks/cli_bench.py): the adapter is imported and asks the cluster, but the dev cluster's
    kubeconfig is JSON and the embedded default is kept decoded, so no YAML parser is loaded; and the
    adapter's own HTTP client replaces every third-party one."""
    from .test_cli_imports import HTTP_LIBRARIES, imported

    session.run("dev-cluster", "start")
    job = tmp_path / "long.yaml"
    job.write_text(LONG)
    assert session.run("submit", str(job), "--job-id", "asks").returncode == 0
    names = imported("-m", "dispatch.cli", "status", "asks", env=session.env)
    assert "dispatch_kubeflow.http" in names  # it asked the cluster
    assert {n.split(".")[0] for n in names} & set(HTTP_LIBRARIES) == set()
