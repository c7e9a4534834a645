"""What people expect of the command line (SPEC §11.1), through the CLI: exit codes that tell the
outcome, quiet pipes, kubectl's output habits, the version, next steps after a failure, and one way of
writing a command.

On a named memory cluster (shared by the commands of this process) with records in SQLite, so that a
subprocess sees the same records.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from dispatch.cli.commands import cli
from dispatch.cli.exits import EXIT_ALREADY_ENDED, EXIT_BROKEN_PIPE

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_JOB = (
    "command: [python, train.py]\nenv: {KUBESIM_SCRIPT: '%s'}\n"
    "extensions:\n  dispatch/Image: {ref: 'pytorch/pytorch:2.5'}\n"
)


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("DISPATCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("DISPATCH_CONFIG", raising=False)
    monkeypatch.delenv("DISPATCH_TOKEN", raising=False)
    path = tmp_path / "cluster.yaml"
    path.write_text(
        f"adapter: memory\nsettings: {{cluster: habits-{uuid.uuid4().hex[:12]}, startDelay: 0, "
        "cessationDelay: 0}\nstore: {sqlite: jobs.db}\n"
    )
    yield path


def invoke(config: Path, *args: str | Path) -> Result:
    return CliRunner().invoke(cli, ["--config", str(config), *(str(a) for a in args)], catch_exceptions=False)


def submit(config: Path, tmp_path: Path, script: str, job_id: str, *extra: str) -> Result:
    jobfile = tmp_path / f"{job_id}.yaml"
    jobfile.write_text(SCRIPT_JOB % script)
    result = invoke(config, "submit", jobfile, "--job-id", job_id, *extra)
    assert result.exit_code == 0, result.stderr
    return result


# ---------------------------------------------------------------------- exit codes and pipes


def test_watch_exits_0_only_when_the_job_succeeded(config: Path, tmp_path: Path) -> None:
    submit(config, tmp_path, "exit 0", "ok")
    submit(config, tmp_path, "exit 3", "bad")
    assert invoke(config, "watch", "ok").exit_code == 0
    failed = invoke(config, "watch", "bad")
    assert failed.exit_code == 1
    assert "failed" in failed.stdout.splitlines()[-1]


def test_run_of_a_failing_job_exits_1_and_ends_with_the_next_steps(config: Path, tmp_path: Path) -> None:
    jobfile = tmp_path / "bad.yaml"
    jobfile.write_text(SCRIPT_JOB % "exit 3")
    result = invoke(config, "run", jobfile, "--job-id", "r1")
    assert result.exit_code == 1
    assert "outcome: failed / exit_code" in result.stdout
    # Pasted, each reaches the same cluster: the options that chose it are in the hint.
    hints = [line for line in result.stderr.splitlines() if line.startswith("next: ")]
    assert any(f"`dispatch --config {config} logs r1`" in h for h in hints), result.stderr
    assert any(f"`dispatch --config {config} describe r1`" in h for h in hints)
    assert any(f"`dispatch --config {config} history r1`" in h for h in hints)
    quiet = invoke(config, "run", jobfile, "--job-id", "r2", "--quiet")
    assert quiet.exit_code == 1 and "next:" not in quiet.stderr


def test_cancel_of_a_finished_job_says_so_and_exits_3(config: Path, tmp_path: Path) -> None:
    submit(config, tmp_path, "exit 0", "done")
    assert invoke(config, "watch", "done").exit_code == 0
    result = invoke(config, "cancel", "done")
    assert result.exit_code == EXIT_ALREADY_ENDED == 3
    assert result.stderr == "error: cannot cancel done@1.0: it already ended succeeded\n"
    assert result.stdout == ""
    status = json.loads(invoke(config, "status", "done", "-o", "json").stdout)
    assert status["outcome"]["state"] == "succeeded"  # not folded to cancelled


def test_history_shows_where_the_job_is_now(config: Path, tmp_path: Path) -> None:
    """A job that ended since the last command: `history` alone (no `status` first) shows its end."""
    submit(config, tmp_path, "sleep 0.3; exit 0", "h1")
    for _ in range(200):  # until the cluster ends it; a stale history would never show it
        lines = invoke(config, "history", "h1").stdout
        if "succeeded" in lines:
            break
        time.sleep(0.05)
    assert re.search(r"^  1 \(h1@1\.0\): succeeded / none", lines, re.M), lines


def test_a_closed_pipe_ends_quietly(config: Path, tmp_path: Path) -> None:
    """`dispatch status JOB | head -1`: the reader is gone before the command writes; no message, and
    the exit code a tool ended by SIGPIPE has (141)."""
    submit(config, tmp_path, "hang", "p1")
    read, write = os.pipe()
    os.close(read)  # the reader went away: every write to the pipe fails
    proc = subprocess.run(
        [sys.executable, "-m", "dispatch.cli", "status", "p1", "--config", str(config)],
        stdout=write,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "DISPATCH_STATE_DIR": str(tmp_path / "state")},
        check=False,
    )
    os.close(write)
    assert proc.stderr == ""
    assert proc.returncode == EXIT_BROKEN_PIPE == 141


ENDING = """
import atexit, sys, threading, time
atexit.register(lambda: print("exit handler ran", file=sys.stderr))
print("written before the command, not flushed")  # stdout is a pipe: block-buffered
if "--with-thread" in sys.argv:
    sys.argv.remove("--with-thread")
    threading.Thread(target=lambda: (time.sleep(0.5), print("thread finished", file=sys.stderr))).start()
from dispatch.cli import main
main()
"""


@pytest.mark.parametrize("thread", [False, True])
def test_the_console_script_ends_as_the_interpreter_would(config: Path, tmp_path: Path, thread: bool) -> None:
    """The console script skips tearing its modules down at exit (docs/cli.md, "Fast reads"); what the
    interpreter's exit does that matters still happens: buffered output is written whole, exit handlers
    run, the exit code is the command's, and a thread still working is waited for."""
    submit(config, tmp_path, "hang", "e1")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered, as usual
    env["DISPATCH_STATE_DIR"] = str(tmp_path / "state")
    extra = ["--with-thread"] if thread else []

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-c", ENDING, "--config", str(config), *args, *extra]
        return subprocess.run(argv, capture_output=True, text=True, env=env, check=False, timeout=120)

    shown = run("status", "e1", "-o", "json")
    assert shown.returncode == 0, shown.stderr
    first, rest = shown.stdout.split("\n", 1)
    assert first == "written before the command, not flushed"
    assert json.loads(rest)["jobId"] == "e1"
    assert "exit handler ran" in shown.stderr
    assert ("thread finished" in shown.stderr) == thread
    missing = run("status", "no-such-job")
    assert missing.returncode == 1
    assert missing.stdout == "written before the command, not flushed\n"  # nothing else flushed stdout
    assert "error: no record for job 'no-such-job'" in missing.stderr
    assert "exit handler ran" in missing.stderr
    usage = run("status", "e1", "-o", "nonsense")
    assert usage.returncode == 2 and "Invalid value for '-o'" in usage.stderr


# ---------------------------------------------------------------------- kubectl's habits


def test_output_formats(config: Path, tmp_path: Path) -> None:
    submit(config, tmp_path, "hang", "o1")
    submit(config, tmp_path, "hang", "o2", "--held")
    assert invoke(config, "list", "-o", "name").stdout == "o1\no2\n"
    assert invoke(config, "status", "o2", "-o", "name").stdout == "o2\n"
    listed = yaml.safe_load(invoke(config, "list", "-o", "yaml").stdout)
    assert [r["jobId"] for r in listed] == ["o1", "o2"]
    wide = invoke(config, "list", "-o", "wide").stdout.splitlines()
    assert wide[0].split() == ["JOB", "STATE", "CAUSE", "EPOCH", "UPDATED", "CREATED", "HANDLE", "INTENTS"]
    bare = invoke(config, "list", "--no-headers").stdout.splitlines()
    assert [line.split()[0] for line in bare] == ["o1", "o2"]
    contradiction = invoke(config, "list", "--json", "-o", "yaml")
    assert contradiction.exit_code == 2 and "--json is -o json" in contradiction.stderr


def test_json_times_are_rfc3339_and_epoch_seconds_on_request(config: Path, tmp_path: Path) -> None:
    submit(config, tmp_path, "hang", "t1")
    record = json.loads(invoke(config, "status", "t1", "--json").stdout)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", record["createdAt"]), record
    history = json.loads(invoke(config, "history", "t1", "--json").stdout)
    assert all(isinstance(t["at"], str) and t["at"].endswith("Z") for t in history)
    epoch = json.loads(invoke(config, "--epoch-times", "status", "t1", "--json").stdout)
    assert isinstance(epoch["createdAt"], float)


def test_version(config: Path) -> None:
    from importlib.metadata import version

    from dispatch.cli.clusters import DISTRIBUTION

    text = invoke(config, "version")
    assert text.exit_code == 0 and text.stdout.startswith(f"dispatch {version(DISTRIBUTION)} ")
    as_json = json.loads(invoke(config, "version", "-o", "json").stdout)
    assert as_json["distribution"] == DISTRIBUTION
    assert invoke(config, "--version").exit_code == 0


def test_job_ids_complete_from_the_store(config: Path, tmp_path: Path) -> None:
    submit(config, tmp_path, "hang", "alpha-1")
    submit(config, tmp_path, "hang", "beta-1")
    env = {
        **os.environ,
        "DISPATCH_STATE_DIR": str(tmp_path / "state"),
        "_DISPATCH_COMPLETE": "bash_complete",
        "COMP_WORDS": f"dispatch --config {config} status al",
        "COMP_CWORD": "4",
    }
    proc = subprocess.run(
        [sys.executable, "-c", "from dispatch.cli import main; main()"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "alpha-1" in proc.stdout and "beta-1" not in proc.stdout, (proc.stdout, proc.stderr)


# ---------------------------------------------------------------------- one way to write a command


def test_no_command_reads_the_store_directly() -> None:
    """Commands go through `Cluster` (docs/architecture.md): none reaches into `cluster.store`."""
    for path in (ROOT / "src" / "dispatch" / "cli").glob("*.py"):
        assert ".store." not in path.read_text().replace("cf.store.", ""), path


# ---------------------------------------------------------------------- config discovery


def _memory(name: str) -> str:
    return f"{{adapter: memory, settings: {{cluster: {name}-{uuid.uuid4().hex[:8]}}}, store: {{sqlite: {name}.db}}}}"


def test_config_is_found_in_the_project_then_in_the_user_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("DISPATCH_CONFIG", raising=False)
    xdg = tmp_path / "xdg"
    (xdg / "dispatch").mkdir(parents=True)
    (xdg / "dispatch" / "config.yaml").write_text(
        f"clusters:\n  lab: {_memory('lab')}\n  prod: {_memory('prod')}\ndefault: lab\n"
    )
    monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)

    def store_of(*args: str) -> str:
        result = CliRunner().invoke(cli, [*args, "check", "-o", "json"], catch_exceptions=False)
        assert result.exit_code == 0, result.stderr
        return str(json.loads(result.stdout)["store"])

    assert store_of().endswith("lab.db")  # the user config's default
    assert store_of("--cluster", "prod").endswith("prod.db")
    (project / "dispatch.yaml").write_text(_memory("here"))  # a project file comes first
    assert store_of().endswith(str(project / "here.db"))
    missing = CliRunner().invoke(cli, ["--cluster", "nope", "list"])
    assert missing.exit_code == 2
    assert "--cluster nope: this file describes one cluster" in missing.stderr
    (project / "dispatch.yaml").unlink()
    missing = CliRunner().invoke(cli, ["--cluster", "nope", "list"])
    assert missing.exit_code == 2
    assert missing.stderr.startswith(f"error: {xdg / 'dispatch' / 'config.yaml'}: ")
    assert "--cluster nope: no such cluster; this file names: lab, prod" in missing.stderr


def test_a_clusters_file_without_a_default_names_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCH_STATE_DIR", str(tmp_path / "state"))
    conf = tmp_path / "c.yaml"
    conf.write_text(f"clusters:\n  a: {_memory('a')}\n  b: {_memory('b')}\n")
    result = CliRunner().invoke(cli, ["--config", str(conf), "list"])
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {conf}: default: several clusters (a, b) and no default: give `default: NAME` or "
        "`dispatch --cluster NAME`\n"
    )
    conf.write_text("clusters:\n  a: {adaptor: memory}\n")
    typo = CliRunner().invoke(cli, ["--config", str(conf), "list"])
    assert typo.exit_code == 2 and f'{conf}: clusters["a"].adaptor: unknown config key' in typo.stderr, (
        typo.stderr
    )


def test_namespace_and_context_are_kubernetes_settings(config: Path) -> None:
    refused = invoke(config, "-n", "team-a", "list")
    assert refused.exit_code == 2
    assert (
        "-n/--namespace: the memory adapter" in refused.stderr
        and "has no namespace setting" in refused.stderr
    )


# ---------------------------------------------------------------------- describe


def test_describe_shows_the_job_whole(config: Path, tmp_path: Path) -> None:
    config.write_text(
        config.read_text() + "policy: {rules: {preempted: {action: requeue, max: 3, backoff: 0.1}}}\n"
    )
    jobfile = tmp_path / "p.yaml"
    jobfile.write_text(SCRIPT_JOB % "env:DISPATCH_EPOCH=1.0: preempt; exit 0")
    assert invoke(config, "run", jobfile, "--job-id", "d1").exit_code == 0
    text = invoke(config, "describe", "d1")
    assert text.exit_code == 0, text.stderr
    out = text.stdout
    assert "command: ['python', 'train.py']" in out and "dispatch/Image" in out
    first, second = out.index("  1.0  failed / preempted"), out.index("  2.1  succeeded / none")
    assert first < second
    assert re.search(r"then: requeued as 2\.1: .*policy rule preempted", out), out
    assert "object: memory:" in out  # each incarnation's cluster object
    assert "next:" in out and f"`dispatch --config {config} history d1`" in out
    as_json = json.loads(invoke(config, "describe", "d1", "-o", "json").stdout)
    assert [i["epoch"] for i in as_json["incarnations"]] == ["1.0", "2.1"]
    assert as_json["record"]["outcome"]["state"] == "succeeded"


def test_contradicting_options_found_by_a_command_are_usage_errors(config: Path) -> None:
    result = invoke(config, "check", "--refresh", "--read-only")
    assert result.exit_code == 2 and "give one of them" in result.stderr


# ---------------------------------------------------------------------- errors that say why


@pytest.mark.parametrize("command", ["hold", "cancel", "release", "resubmit"])
def test_a_write_on_a_read_only_config_says_why(config: Path, tmp_path: Path, command: str) -> None:
    submit(config, tmp_path, "hang", "ro1")
    config.write_text(config.read_text() + "readOnly: true\n")
    result = invoke(config, command, "ro1")
    assert result.exit_code == 1
    assert result.stderr.startswith(f"error: cannot {command} ro1: {config} says readOnly: true"), (
        result.stderr
    )


def test_validate_without_a_cluster_says_it_was_not_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.delenv("DISPATCH_CONFIG", raising=False)
    monkeypatch.chdir(tmp_path)
    jobfile = tmp_path / "j.yaml"
    jobfile.write_text(SCRIPT_JOB % "exit 0")
    result = CliRunner().invoke(cli, ["validate", str(jobfile)], catch_exceptions=False)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[-1] == (
        "note: the cluster was not asked: no cluster config (--config, $DISPATCH_CONFIG) and the dev "
        "cluster is not running (`dispatch dev-cluster start` starts it); not checked: whether the cluster "
        "can run what the job names (a runtime that exists and obeys the adapter's rules), its limits "
        "(nodes, command, environment), and the config's settings (a queue that exists)"
    )
    from dispatch.cli import devcluster

    assert devcluster.running(tmp_path / "state" / "dev-cluster") is None  # validate started nothing


def test_list_selects_by_label_and_watches(config: Path, tmp_path: Path) -> None:
    vision = SCRIPT_JOB.replace("env: {", "env: {TEAM: vision, ")
    for job_id, text in (("v1", vision % "hang"), ("n1", SCRIPT_JOB % "hang")):
        (tmp_path / f"{job_id}.yaml").write_text(text)
        assert invoke(config, "submit", tmp_path / f"{job_id}.yaml", "--job-id", job_id).exit_code == 0
    assert invoke(config, "list", "-l", "env.TEAM=vision", "-o", "name").stdout == "v1\n"
    assert invoke(config, "list", "-l", "env.TEAM!=vision,state=running", "-o", "name").stdout == "n1\n"
    bad = invoke(config, "list", "-l", "team=vision")
    assert bad.exit_code == 2
    assert (
        "-l: 'team=vision': unknown key 'team'; the keys are state, cause, epoch, adapter, env.NAME"
        in bad.stderr
    )


# ---------------------------------------------------------------------- every day, round 3 (issue 38)


def test_run_no_supervise_is_recorded_so_no_supervisor_requeues_the_job(config: Path, tmp_path: Path) -> None:
    config.write_text(
        config.read_text() + "policy: {rules: {preempted: {action: requeue, max: 3, backoff: 0}}}\n"
    )
    jobfile = tmp_path / "p.yaml"
    jobfile.write_text(SCRIPT_JOB % "env:DISPATCH_EPOCH=1.0: preempt; exit 0")
    run = invoke(config, "run", jobfile, "--job-id", "ns1", "--no-supervise")
    assert run.exit_code == 1 and "outcome: failed / preempted" in run.stdout, run.stdout + run.stderr
    for _ in range(2):  # the policy would requeue a preemption: the job's own choice says no
        assert invoke(config, "supervise", "--once", "--poll", "0.1", "--lease", "5").exit_code == 0
    after = json.loads(invoke(config, "status", "ns1", "-o", "json").stdout)
    assert (after["epoch"], after["outcome"]["state"]) == ("1.0", "failed"), after
    history = json.loads(invoke(config, "history", "ns1", "-o", "json").stdout)
    assert "requeued" not in [t["what"] for t in history]
    assert "no requeue: every failure is final" in invoke(config, "describe", "ns1").stdout


def test_run_says_what_it_waits_for_when_nothing_changes(config: Path, tmp_path: Path) -> None:
    from dispatch.cli.following import QUIET

    jobfile = tmp_path / "slow.yaml"
    jobfile.write_text(SCRIPT_JOB % f"sleep {QUIET + 3:g}; exit 0")
    result = invoke(config, "run", jobfile, "--job-id", "slow")
    assert result.exit_code == 0, result.stderr
    waiting = [line for line in result.stderr.splitlines() if "waiting for" in line]
    assert waiting and "slow@1.0  waiting for it to end: running since" in waiting[0], result.stderr


def test_cancel_prints_where_the_job_is_and_with_wait_how_it_ended(config: Path, tmp_path: Path) -> None:
    config.write_text(config.read_text().replace("cessationDelay: 0", "cessationDelay: 1"))
    submit(config, tmp_path, "hang", "c1")
    submit(config, tmp_path, "hang", "c2")
    asked = invoke(config, "cancel", "c1")
    assert asked.exit_code == 0, asked.stderr
    assert asked.stdout.startswith("cancel: c1@1.0: "), asked.stdout
    waited = invoke(config, "cancel", "c2", "--wait")
    assert waited.exit_code == 0, waited.stderr
    assert waited.stdout.splitlines()[-1].endswith(" c2@1.0: cancelled (cancelled)"), waited.stdout


def test_cancel_of_a_queued_job_that_never_ran_says_cancelled_and_of_a_running_one_stopping(
    config: Path, tmp_path: Path
) -> None:
    """Issue 38: ``cancel`` printed ``running`` even for a job that was queued and never ran."""
    config.write_text(
        config.read_text().replace(
            "startDelay: 0, cessationDelay: 0", "nodes: 1, startDelay: 0, cessationDelay: 1"
        )
    )
    submit(config, tmp_path, "hang", "runs")
    assert submit(config, tmp_path, "hang", "waits").stdout == "submitted waits@1.0: queued (no_capacity)\n"
    assert json.loads(invoke(config, "status", "waits", "-o", "json").stdout)["outcome"]["state"] == "queued"
    queued = invoke(config, "cancel", "waits")
    assert (queued.exit_code, queued.stdout) == (0, "cancel: waits@1.0: cancelled (cancelled)\n"), (
        queued.stdout
    )
    running = invoke(config, "cancel", "runs")
    assert running.exit_code == 0, running.stderr
    assert running.stdout == "cancel: runs@1.0: stop asked; the job is stopping until its compute is gone\n"


@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_a_job_file_that_is_not_a_regular_file_is_refused_at_once(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "job.yaml"
    if kind == "fifo":
        os.mkfifo(path)  # nobody writes to it: reading it would wait for ever
    else:
        path = Path(os.devnull)
    env = {**os.environ, "DISPATCH_STATE_DIR": str(tmp_path / "state")}
    env.pop("DISPATCH_CONFIG", None)
    done = subprocess.run(
        [sys.executable, "-m", "dispatch.cli", "validate", str(path)],
        capture_output=True, text=True, env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    what = "a FIFO" if kind == "fifo" else "a device"
    assert done.stderr == f"error: {path}: the job file is {what}: dispatch reads only a regular file\n"


def test_describe_shows_terminal_escape_sequences_as_text(config: Path, tmp_path: Path) -> None:
    jobfile = tmp_path / "esc.json"
    jobfile.write_text(
        json.dumps(
            {"command": ["train", "\x1b[2J"], "env": {"KUBESIM_SCRIPT": "exit 0", "T": "\x1b]0;pwned\x07x"}}
        )
    )
    assert invoke(config, "submit", jobfile, "--job-id", "esc").exit_code == 0
    out = invoke(config, "describe", "esc").stdout
    assert "\x1b" not in out and "\x07" not in out
    assert "T=\\x1b]0;pwned\\x07x" in out and "'\\x1b[2J'" in out, out


def test_logs_of_a_record_of_another_cluster_says_so_in_words(config: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.yaml"  # another memory cluster over the same store
    other.write_text(config.read_text().replace("habits-", "other-"))
    submit(other, tmp_path, "exit 3", "theirs")
    assert invoke(other, "watch", "theirs").exit_code == 1
    result = invoke(config, "logs", "theirs")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot read the output of theirs: it ran on memory:"), (
        result.stderr
    )
    assert "not on this cluster" in result.stderr and "last known: theirs@1.0 failed" in result.stderr
    assert "Handle(" not in result.stderr


def test_a_string_a_process_cannot_be_given_is_refused_at_submit_naming_the_limit(
    config: Path, tmp_path: Path
) -> None:
    big = tmp_path / "big.json"
    big.write_text(
        json.dumps({"command": ["train"], "env": {"KUBESIM_SCRIPT": "exit 0", "BIG": "y" * 200_000}})
    )
    result = invoke(config, "submit", big, "--job-id", "big")
    assert result.exit_code == 2
    assert result.stderr.startswith(f'error: {big}: env["BIG"]: BIG=VALUE is 200,004 bytes'), result.stderr
    assert "MAX_ARG_STRLEN" in result.stderr
    assert invoke(config, "status", "big").exit_code == 1  # refused before any record was written
