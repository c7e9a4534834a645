"""examples/train/job.yaml trains for real on the dev cluster in the processes mode, through the CLI: two
ranks train; preempted by the scheduler after a checkpoint, the job is requeued by `dispatch run`'s
supervisor, and incarnation 2 resumes from the checkpoint written on SIGTERM and ends with the loss of a run
never interrupted. Real processes throughout: `dispatch`, the dev cluster (`python -m kubesim serve
--processes`), the training ranks as the pods' processes, and kubectl."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from .trainlog import BIN, ROOT, WAIT, Run, Session, ranks, until_checkpoint

JOB = "examples/train/job.yaml"
K = 10  # the job file's --checkpoint-every
STEPS = 100  # its --steps


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    s = Session(tmp_path_factory.mktemp("train"))
    started = s.run("dev-cluster", "start", "--processes", "--json")
    assert started.returncode == 0, started.stderr
    try:
        yield s
    finally:
        s.run("dev-cluster", "stop", timeout=60)


def _node0(session: Session, job: str) -> Run:
    done = session.run("logs", job, "--node", "0")
    assert done.returncode == 0, done.stderr
    return Run.of(done.stdout.splitlines())


def _native(session: Session, job: str) -> str:
    """The TrainJob of the job's current incarnation (its handle: ``kubeflow:NS/NAME (...)``)."""
    status = session.run("--json", "status", job)
    assert status.returncode == 0, status.stderr
    ref = json.loads(status.stdout)["handle"]["ref"]
    return str(ref).split("/", 1)[1]


@pytest.mark.timeout(900)
def test_the_training_job_is_preempted_after_a_checkpoint_and_resumes_to_the_same_loss(
    session: Session,
) -> None:
    status = json.loads(session.run("dev-cluster", "status", "--json").stdout)
    assert status["processes"] is True and status["workdir"] == str(ROOT)

    plain = session.run("run", JOB, "--job-id", "plain")
    assert plain.returncode == 0, plain.stdout + plain.stderr
    uninterrupted = _node0(session, "plain")
    assert [s for s, _ in uninterrupted.steps] == list(range(1, STEPS + 1))
    assert (
        _node0(session, "plain").steps
        == Run.of(session.run("logs", "plain", "--node", "1").stdout.splitlines()).steps
    )

    run = session.start("run", JOB, "--job-id", "preempted")
    try:
        # Incarnation 1's rank 0, followed live (the run has submitted once `logs` finds the job).
        follow = _follow_when_submitted(session, "preempted")
        lines = until_checkpoint(follow, K)
        assert follow.stdout is not None
        # The scheduler preempts rank 0 (kubesim's disruption, asked from outside as kubectl asks).
        pod = session.kubectl(
            "get", "pods", "-o", "name", "-l",
            f"jobset.sigs.k8s.io/jobset-name={_native(session, 'preempted')},batch.kubernetes.io/job-completion-index=0",
        ).split()  # fmt: skip
        assert len(pod) == 1, pod
        session.kubectl("annotate", pod[0], "kubesim.io/disrupt=preempt")
        lines += [line.rstrip("\n") for line in follow.stdout]  # to the end of incarnation 1's rank 0
        assert follow.wait(timeout=WAIT) == 0
        out, err = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out + err
    assert "failed  (preempted)" in out and "supervisor  requeued" in out and "preempted@2.1" in out
    assert "outcome: succeeded / none  (preempted@2.1)" in out
    first = Run.of(lines)
    reached = first.reached
    assert K <= reached < STEPS
    assert first.checkpoints[-1] == reached  # written on SIGTERM, when the pod was preempted
    assert any(line.startswith(f"stopping after step {reached}") for line in lines)

    second = _node0(session, "preempted")  # the current incarnation: 2
    assert second.resumed_from == reached
    assert second.first - 1 >= K and second.first < reached + K  # never from 0, never past a step not reached
    assert second.reached == STEPS
    assert second.final_loss == uninterrupted.final_loss  # to the float
    history = session.run("history", "preempted")
    assert "requeue 1 of 3 under rule preempted" in history.stdout
    # Incarnation 1's lines were those followed above: its pods, and their logs, are gone, as `logs` says.
    earlier = session.run("logs", "preempted", "--epoch", "1")
    assert earlier.returncode == 1, earlier.stdout + earlier.stderr
    assert "on Kubernetes an incarnation's pods, with their logs, are removed" in earlier.stderr, (
        earlier.stderr
    )


def _follow_when_submitted(session: Session, job: str, *common: str) -> subprocess.Popen[str]:
    """``dispatch logs JOB --follow --node 0`` once the job exists (it waits for the node to start)."""
    deadline = time.monotonic() + WAIT
    while session.run(*common, "--json", "status", job).returncode != 0:
        assert time.monotonic() < deadline, f"{job} was not submitted within {WAIT:g} s"
        time.sleep(0.2)
    return session.start(*common, "logs", job, "--follow", "--node", "0")


@pytest.mark.timeout(900)
def test_preempted_by_kueue_it_resumes_in_place_from_its_checkpoint(session: Session) -> None:
    """examples/train/queued-cluster.yaml sends the job through Kueue; examples/train/urgent.yaml, a job of
    higher priority, takes its quota. Kueue suspends it (its pods get SIGTERM), requeues its Workload and
    admits it again once the urgent job is done: the same incarnation starts over and resumes from its own
    checkpoint."""
    config = session.home / "queued-cluster.yaml"
    text = (ROOT / "examples" / "train" / "queued-cluster.yaml").read_text()
    config.write_text(text.replace("~/.local/state/dispatch/dev-cluster/kubeconfig", str(session.kubeconfig)))
    run = session.start("--config", str(config), "run", JOB, "--job-id", "queued")
    try:
        follow = _follow_when_submitted(session, "queued", "--config", str(config))
        lines = until_checkpoint(follow, K)
        assert follow.stdout is not None
        session.kubectl("apply", "-f", str(ROOT / "examples" / "train" / "urgent.yaml"))
        lines += [line.rstrip("\n") for line in follow.stdout]  # to the end of the first pods
        follow.wait(timeout=WAIT)
        out, err = run.communicate(timeout=600)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out + err
    # Kueue suspends it (the adapter reads queued/preempted); within one incarnation the state never goes
    # back (SPEC §2.3), so the record stays running, with the preemption as its cause, until it resumes.
    assert "running  (preempted)" in out and "outcome: succeeded / none  (queued@1.0)" in out, out
    first = Run.of(lines)
    assert first.checkpoints[-1] == first.reached  # written on SIGTERM, when Kueue suspended it
    again = Run.of(session.run("--config", str(config), "logs", "queued", "--node", "0").stdout.splitlines())
    assert again.resumed_from == first.reached and again.first == first.reached + 1
    assert again.final_loss == _uninterrupted(session.home)


def _uninterrupted(cwd: Path) -> str:
    """The final loss of the job file's command never interrupted: its two ranks on loopback, at full speed."""
    spec = yaml.safe_load((ROOT / JOB).read_text())
    args = list(spec["command"][2:])
    at = args.index("--step-time")
    del args[at : at + 2]
    group = ranks(2, args, cwd, extra={"DISPATCH_CHECKPOINT_DIR": str(cwd / "reference")})
    assert [r.finish() for r in group] == [0, 0], [r.output() for r in group]
    return group[0].run().final_loss


@pytest.mark.timeout(600)
def test_the_scripted_preempted_example_runs_its_script_beside_them(session: Session) -> None:
    """examples/preempted.yaml carries a KUBESIM_SCRIPT: its pods run the script, not `python -m train`."""
    done = session.run("run", "examples/preempted.yaml", "--job-id", "scripted")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "failed  (preempted)" in done.stdout and "outcome: succeeded / none  (scripted@2.1)" in done.stdout
    logs = session.run("logs", "scripted")
    assert "[node 1] node 1: done" in logs.stdout, logs.stdout


@pytest.mark.timeout(300)
def test_stopping_the_dev_cluster_stops_the_pods_processes(tmp_path: Path) -> None:
    s = Session(tmp_path)
    assert s.run("dev-cluster", "start", "--processes").returncode == 0
    try:
        code = "import os, time; print('pid', os.getpid(), flush=True); time.sleep(600)"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "sleeper", "namespace": "default"},
            "spec": {
                "containers": [
                    {"name": "node", "image": "example.org/x:1", "command": ["python3", "-c", code]}
                ]
            },
        }
        (tmp_path / "pod.json").write_text(json.dumps(pod))
        s.kubectl("apply", "-f", str(tmp_path / "pod.json"))
        s.kubectl("wait", "--for=condition=Ready", "pod/sleeper", f"--timeout={WAIT:g}s")
        logs = subprocess.Popen(
            [str(BIN / "kubectl"), "--kubeconfig", str(s.kubeconfig), "logs", "-f", "sleeper"],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert logs.stdout is not None
        pid = int(logs.stdout.readline().split()[1])
        os.kill(pid, 0)  # running
    finally:
        stopped = s.run("dev-cluster", "stop", timeout=60)
    assert stopped.returncode == 0
    logs.wait(timeout=WAIT)  # the stream ended with the cluster
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
