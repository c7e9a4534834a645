"""Every day with dispatch on a Kubernetes cluster (issue 38), through the ``dispatch`` console script as a
person meets it: a kubesim of this module's own (Kueue on, a read-only identity too), a config file naming
it, records in SQLite. What can be read is printed and what cannot is named; what is refused says why and
names the limit; what is waited for is said.

Real processes throughout: ``python -m kubesim serve``, ``dispatch``, ``kubectl``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.timeout(300)


class Served:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.kubeconfig = directory / "kc"
        self.readonly = directory / "kc-readonly"
        self.store = directory / "jobs.db"
        self.config = self.write_config("cluster.yaml", self.kubeconfig)

    def write_config(self, name: str, kubeconfig: Path, extra: str = "") -> Path:
        path = self.directory / name
        path.write_text(
            "adapter: kubeflow\n"
            f"settings: {{kubeconfig: {kubeconfig}, namespace: default{extra}}}\n"
            f"store: {{sqlite: {self.store}}}\n"
        )
        return path

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "KUBECONFIG"))}
        env["DISPATCH_STATE_DIR"] = str(self.directory / "state")  # no dev cluster is started here
        return env

    def dispatch(self, *args: str | Path, config: Path | None = None) -> subprocess.CompletedProcess[str]:
        chosen = ["--config", str(config or self.config)]
        return subprocess.run(
            [str(BIN / "dispatch"), *chosen, *(str(a) for a in args)],
            env=self.env(), cwd=ROOT, capture_output=True, text=True, timeout=240,
        )  # fmt: skip

    def kubectl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    directory = tmp_path_factory.mktemp("everyday")
    here = Served(directory)
    proc = subprocess.Popen(
        [sys.executable, "-m", "kubesim", "serve", "--kubeconfig", str(here.kubeconfig),
         "--readonly-kubeconfig", str(here.readonly), "--speed", "4"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        while "kubeconfig written" not in proc.stdout.readline():
            assert proc.poll() is None, "kubesim serve exited early"
        checked = here.dispatch("check")  # the probe, once: later commands reuse its findings
        assert checked.returncode == 0, checked.stderr
        yield here
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_logs_prints_what_can_be_read_and_names_what_cannot(served: Served) -> None:
    run = served.dispatch("run", "examples/oom.yaml", "--job-id", "oom")
    assert run.returncode == 1 and "outcome: failed / out_of_memory" in run.stdout, run.stdout + run.stderr
    # Node 1 ran out of memory; the hint names it, with the options that reach this cluster.
    assert f"`dispatch --config {served.config} logs oom --node 1` shows what node 1" in run.stderr, (
        run.stderr
    )
    # Node 0's pod is gone (as when its Job was removed); node 1's still has its output.
    gone = served.kubectl("delete", "pods", "-l", "batch.kubernetes.io/job-completion-index=0", "--wait=true")
    assert gone.returncode == 0, gone.stderr

    logs = served.dispatch("logs", "oom")
    assert logs.returncode == 1
    assert logs.stdout == "[node 1] loading a batch too large\n", logs.stdout + logs.stderr
    assert "error: node 0 of oom@1.0 has no pod" in logs.stderr, logs.stderr
    assert "read 1 of 2 node(s); node(s) 0 could not be read" in logs.stderr

    as_json = [json.loads(line) for line in served.dispatch("logs", "oom", "-o", "json").stdout.splitlines()]
    assert {"jobId": "oom", "node": 1, "line": "loading a batch too large"} in as_json
    assert [x["node"] for x in as_json if "error" in x] == [0]

    # An epoch as every command shows it, or its number.
    for epoch in ("1.0", "1"):
        one = served.dispatch("logs", "oom", "--node", "1", "--epoch", epoch)
        assert (one.returncode, one.stdout) == (0, "loading a batch too large\n"), one.stderr
    wrong = served.dispatch("logs", "oom", "--epoch", "1.1")
    assert wrong.returncode == 1 and "oom has no epoch 1.1: its incarnation 1 is 1.0" in wrong.stderr
    bad = served.dispatch("logs", "oom", "--epoch", "one")
    assert bad.returncode == 2 and "--epoch: 'one': expected an incarnation as shown, N.R" in bad.stderr


def test_logs_of_another_adapters_record_says_so_without_a_repr(served: Served, tmp_path: Path) -> None:
    memory = tmp_path / "memory.yaml"  # another adapter's cluster, over the same store
    memory.write_text(f"adapter: memory\nsettings: {{startDelay: 0}}\nstore: {{sqlite: {served.store}}}\n")
    job = tmp_path / "exit3.yaml"
    job.write_text('command: [train]\nenv: {KUBESIM_SCRIPT: "exit 3"}\n')
    ran = served.dispatch("run", job, "--job-id", "elsewhere", config=memory)
    assert ran.returncode == 1, ran.stderr
    logs = served.dispatch("logs", "elsewhere")
    assert logs.returncode == 1
    assert logs.stderr.startswith("error: cannot read the output of elsewhere: it ran on memory:"), (
        logs.stderr
    )
    assert "shown as last known: elsewhere@1.0 failed" in logs.stderr and "Handle(" not in logs.stderr


def test_run_shows_what_the_nodes_printed_when_the_job_succeeds(served: Served) -> None:
    run = served.dispatch("run", "examples/hello.yaml", "--job-id", "hello")
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    tail = lines[lines.index("  output (the last 5 lines of each node):") :]
    assert "    [node 0] hello from rank 0 of hello at epoch 1.0" in tail, run.stdout
    assert "    [node 1] hello from rank 1 of hello at epoch 1.0" in tail


def test_validate_refuses_a_queue_that_check_and_run_refuse(served: Served) -> None:
    typo = served.write_config("typo.yaml", served.kubeconfig, ", queue: user-qeueu")
    for command in (("check",), ("validate", "examples/hello.yaml"), ("run", "examples/hello.yaml")):
        done = served.dispatch(*command, config=typo)
        assert done.returncode == 1, (command, done.stdout, done.stderr)
        assert f'error: {typo}: settings.queue: the Kueue LocalQueue "user-qeueu"' in done.stderr, done.stderr
        assert "LocalQueues that exist: user-queue" in done.stderr


def test_list_filters_by_namespace_and_refuses_a_context_naming_those_there(served: Served) -> None:
    submitted = served.dispatch("submit", "examples/hello.yaml", "--job-id", "in-default")
    assert submitted.returncode == 0, submitted.stderr
    there = served.dispatch("list", "-n", "default", "-o", "name")
    assert "in-default" in there.stdout.split(), there.stderr
    elsewhere = served.dispatch("list", "-n", "kube-system", "-o", "name")
    assert elsewhere.returncode == 0 and elsewhere.stdout == ""
    assert "no job in namespace kube-system; namespaces with jobs: default" in elsewhere.stderr
    nope = served.dispatch("list", "--context", "nope")
    assert nope.returncode == 2 and nope.stdout == ""
    assert "no context 'nope' (contexts there: " in nope.stderr, nope.stderr


def test_a_held_submit_writes_a_held_event_as_hold_does(served: Served) -> None:
    held = served.dispatch("submit", "examples/hello.yaml", "--job-id", "held", "--held")
    assert held.returncode == 0 and "submitted held@1.0: held" in held.stdout, held.stderr
    name = json.loads(served.dispatch("status", "held", "-o", "json").stdout)["handle"]["ref"].split("/")[1]
    events = served.kubectl(
        "get", "events", "-o", "json", "--field-selector", f"involvedObject.name={name},reason=Held"
    )
    messages = [e["message"] for e in json.loads(events.stdout)["items"]]
    assert messages == ["job held epoch 1.0: created held by the user"], events.stdout + events.stderr
    assert served.dispatch("cancel", "held").returncode == 0


def test_observe_only_credentials_say_why_a_write_is_refused(served: Served, tmp_path: Path) -> None:
    readonly = served.write_config("readonly.yaml", served.readonly)
    job = tmp_path / "long.yaml"
    job.write_text((ROOT / "examples" / "hello.yaml").read_text().replace("sleep 2", "sleep 3600"))
    assert served.dispatch("submit", job, "--job-id", "mine").returncode == 0
    why = "these credentials may not create, patch, delete TrainJobs in namespace 'default'"
    submit = served.dispatch("submit", "examples/hello.yaml", config=readonly)
    assert submit.returncode == 1
    assert f"is observe-only: it accepts no writes; {why}" in submit.stderr, submit.stderr
    hold = served.dispatch("hold", "mine", config=readonly)
    assert hold.returncode == 1
    assert "cannot hold jobs (capability 'holds')" in hold.stderr and f"observe-only: {why}" in hold.stderr
    assert served.dispatch("cancel", "mine").returncode == 0


def test_cancel_says_where_the_job_is_and_waits_for_its_end(served: Served, tmp_path: Path) -> None:
    job = tmp_path / "long.yaml"
    job.write_text((ROOT / "examples" / "hello.yaml").read_text().replace("sleep 2", "sleep 3600"))
    assert served.dispatch("submit", job, "--job-id", "long").returncode == 0
    cancel = served.dispatch("cancel", "long", "--wait")
    assert cancel.returncode == 0, cancel.stderr
    first, *_, last = cancel.stdout.splitlines()
    assert first.startswith("cancel: long@1.0: "), cancel.stdout
    assert last == "ended: long@1.0: cancelled (cancelled)", cancel.stdout


def test_what_a_node_cannot_be_given_is_refused_at_submit_naming_the_limit(
    served: Served, tmp_path: Path
) -> None:
    job = yaml.safe_load((ROOT / "examples" / "hello.yaml").read_text())
    for what, change in (
        ("command[2]", {"command": ["python", "-c", "x" * 900_000]}),
        ('env["BIG"]', {"env": {"BIG": "y" * 200_000}}),
    ):
        path = tmp_path / "big.json"
        path.write_text(json.dumps({**job, **change}))
        for dry in ((), ("--dry-run",)):
            done = served.dispatch("submit", path, *dry)
            assert done.returncode == 2, done.stderr
            assert f"\nerror: {path}: {what}: " in "\n" + done.stderr, done.stderr
            assert "on a Kubernetes node may hold at most 131,071 (Linux's MAX_ARG_STRLEN)" in done.stderr


def test_twenty_thousand_environment_entries_are_refused_at_submit_naming_the_limit(
    served: Served, tmp_path: Path
) -> None:
    """Issue 38: 20,000 env entries were accepted and failed later on the cluster. A TrainJob's node
    carries at most 128 (Trainer's limit), dispatch's own two among them: refused at once, said so."""
    job = yaml.safe_load((ROOT / "examples" / "hello.yaml").read_text())
    path = tmp_path / "many.json"
    path.write_text(
        json.dumps({**job, "env": {**job.get("env", {}), **{f"E{i}": "v" for i in range(20_000)}}})
    )
    for dry in ((), ("--dry-run",)):
        done = served.dispatch("submit", path, "--job-id", "many", *dry)
        assert done.returncode == 2, done.stdout + done.stderr
        assert (
            f"\nerror: {path}: env: 20001 entries plus dispatch's 2 (DISPATCH_JOB_ID, DISPATCH_EPOCH) "
            in ("\n" + done.stderr)
        ), done.stderr
        assert "exceed Trainer's limit of 128; at most 126 are allowed" in done.stderr
    assert served.dispatch("status", "many").returncode == 1  # refused before any record was written
