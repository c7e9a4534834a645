"""The ``dispatch`` CLI, in-process with click's CliRunner and once as a real subprocess.

The memory adapter runs on real time here (a CLI is a real program), with delays of zero and short
scripts; a named memory cluster (``settings.cluster``) lets several commands in this process share it.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from dispatch.cli.commands import cli

ROOT = Path(__file__).resolve().parents[2]


def _memory_examples() -> Path:
    """The examples as the memory adapter takes them: without kubeflow/RuntimeRef (which it refuses)."""
    d = Path(tempfile.mkdtemp(prefix="dispatch-memory-examples-"))
    for f in (ROOT / "examples").glob("*.yaml"):
        lines = f.read_text().splitlines(keepends=True)
        (d / f.name).write_text("".join(line for line in lines if "kubeflow/RuntimeRef" not in line))
    return d


EXAMPLES = _memory_examples()
SECRET = "tok-3f1d9c-never-print-me"


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A cluster config: a memory cluster private to this test, records in a SQLite file."""
    path = tmp_path / "cluster.yaml"
    path.write_text(
        f"adapter: memory\n"
        f"settings: {{cluster: cli-{uuid.uuid4().hex[:12]}, startDelay: 0, cessationDelay: 0.2}}\n"
        f"store: {{sqlite: jobs.db}}\n"
    )
    return path


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("DISPATCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("DISPATCH_CONFIG", raising=False)
    monkeypatch.delenv("DISPATCH_TOKEN", raising=False)
    yield
    # A command here that fell back on the embedded default must not leave a dev cluster behind.
    from dispatch.cli import devcluster

    leaked = devcluster.stop(tmp_path / "state" / "dev-cluster")
    assert leaked is None, "this test started the dev cluster: give it --config"


def invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def job(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


QUICK = (
    "command: [python, train.py]\n"
    "env: {KUBESIM_SCRIPT: '%s'}\n"
    "extensions:\n  dispatch/Image: {ref: 'pytorch/pytorch:2.5'}\n"
)


# ---------------------------------------------------------------------- run: the quick start


def test_run_hello_succeeds(config: Path) -> None:
    result = invoke("run", "--config", config, EXAMPLES / "hello.yaml", "--job-id", "hello")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "submitted" in result.stdout
    assert "running" in result.stdout
    assert "outcome: succeeded / none" in result.stdout


def test_run_preempted_shows_the_typed_cause_and_evidence(config: Path) -> None:
    result = invoke("run", "--config", config, EXAMPLES / "preempted.yaml", "--no-supervise")
    assert result.exit_code == 1
    assert "outcome: failed / preempted" in result.stdout
    assert "evidence:" in result.stdout
    assert "(preempted)" in result.stdout  # the transition carries the cause too


def test_run_oom_json_lines_parse_and_end_with_the_record(config: Path) -> None:
    result = invoke("run", "--config", config, EXAMPLES / "oom.yaml", "--json")
    assert result.exit_code == 1
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    transitions = [x["transition"] for x in lines[:-1]]
    assert transitions[0]["what"] == "submitted"
    ended = [t for t in transitions if "state" in t][-1]
    assert ended["state"] == "failed" and ended["cause"] == "out_of_memory"
    assert transitions[-1]["what"] == "gave up"  # the supervisor applied the policy: no requeue
    outcome = lines[-1]["record"]["outcome"]
    assert (outcome["state"], outcome["cause"]) == ("failed", "out_of_memory")
    assert outcome["evidence"][0]["exitCode"] == 137


# ---------------------------------------------------------------------- validate


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("command: [x]\nnodez: 2\n", "nodez"),
        ("command: [x]\ntimeLimit: null\n", "timeLimit"),
        ("command: [x]\nenv: {DISPATCH_JOB_ID: a}\n", 'env["DISPATCH_JOB_ID"]'),
        (
            "command: [x]\nextensions: {dispatch/Image: {ref: a, tag: b}}\n",
            'extensions["dispatch/Image"].tag',
        ),
        ("command: [x, 3]\n", "command[1]"),
    ],
)
def test_validate_refusals_name_the_path_and_exit_2(tmp_path: Path, text: str, path: str) -> None:
    jobfile = job(tmp_path, text)
    result = invoke("validate", jobfile)
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {jobfile}: {path}: ")
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr


def test_validate_json_error_parses(tmp_path: Path) -> None:
    result = invoke("validate", job(tmp_path, "command: [x]\nnodes: 0\n"), "--json")
    assert result.exit_code == 2
    body = json.loads(result.stdout)["error"]
    assert body["type"] == "InvalidError" and body["path"] == "nodes"


def test_validate_ok_and_json(tmp_path: Path) -> None:
    result = invoke("validate", EXAMPLES / "hello.yaml")
    assert result.exit_code == 0 and result.stdout.startswith("ok:")
    result = invoke("validate", EXAMPLES / "hello.yaml", "--json")
    assert json.loads(result.stdout)["spec"]["nodes"] == 2


def test_validate_refuses_an_extension_no_adapter_knows(tmp_path: Path) -> None:
    result = invoke("validate", job(tmp_path, "command: [x]\nextensions: {acme/Gpu: {count: 1}}\n"))
    assert result.exit_code == 1
    assert "acme/Gpu" in result.stderr


def test_a_missing_job_file_is_a_clear_error(tmp_path: Path) -> None:
    result = invoke("validate", tmp_path / "nope.yaml")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and "nope.yaml" in result.stderr


# ---------------------------------------------------------------------- the other commands


def test_submit_status_list_history_cancel_resubmit(tmp_path: Path, config: Path) -> None:
    # No cessation delay: the cancelled job's compute is gone when `cancel` returns, so `resubmit` has
    # nothing to wait for and must succeed at once (no retry after a sleep, which could hide a bug).
    config.write_text(config.read_text().replace("cessationDelay: 0.2", "cessationDelay: 0"))
    jobfile = job(tmp_path, QUICK % "hang")
    result = invoke("submit", "--config", config, jobfile, "--job-id", "j1")
    assert result.exit_code == 0, result.stderr
    assert result.stdout.startswith("submitted j1@1.0:")

    status = invoke("status", "--config", config, "j1", "--json")
    assert json.loads(status.stdout)["outcome"]["state"] == "running"
    assert "state:" in invoke("status", "--config", config, "j1").stdout

    listed = invoke("list", "--config", config)
    assert listed.stdout.splitlines()[0].split() == ["JOB", "STATE", "CAUSE", "EPOCH", "UPDATED"]
    assert "j1" in listed.stdout
    assert [r["jobId"] for r in json.loads(invoke("list", "--config", config, "--json").stdout)] == ["j1"]
    assert json.loads(invoke("list", "--config", config, "--state", "failed", "--json").stdout) == []

    cancelled = invoke("cancel", "--config", config, "j1")
    assert cancelled.exit_code == 0
    assert "cancelled" in cancelled.stdout

    history = json.loads(invoke("history", "--config", config, "j1", "--json").stdout)
    assert [t["what"] for t in history][:2] == ["submitted", "started"]
    assert "cancel requested" in [t["what"] for t in history]

    # Its compute may still be stopping (cessation delay): resubmit waits for it, then starts N+1.
    again = invoke("resubmit", "--config", config, "j1")
    assert again.exit_code == 0, again.stderr
    assert "j1@2.0" in again.stdout


def test_hold_and_release(tmp_path: Path, config: Path) -> None:
    jobfile = job(tmp_path, QUICK % "hang")
    assert invoke("submit", "--config", config, jobfile, "--job-id", "h1", "--held").exit_code == 0
    assert (
        json.loads(invoke("status", "--config", config, "h1", "--json").stdout)["outcome"]["state"] == "held"
    )
    released = invoke("release", "--config", config, "h1")
    assert released.exit_code == 0, released.stderr
    assert invoke("hold", "--config", config, "h1").exit_code == 0
    again = invoke("release", "--config", config, "h1", "--json")
    assert json.loads(again.stdout)["jobId"] == "h1"


def test_submit_dry_run_prints_the_native_object(config: Path) -> None:
    result = invoke("submit", "--config", config, EXAMPLES / "hello.yaml", "--dry-run", "--job-id", "dry")
    assert result.exit_code == 0
    import yaml

    native = yaml.safe_load(result.stdout)
    assert isinstance(native, dict) and "dry" in json.dumps(native)
    as_json = invoke("submit", "--config", config, EXAMPLES / "hello.yaml", "--dry-run", "--json")
    assert isinstance(json.loads(as_json.stdout), dict)
    assert json.loads(invoke("list", "--config", config, "--json").stdout) == []


def test_unknown_job_is_a_one_line_error(config: Path) -> None:
    result = invoke("status", "--config", config, "nope")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: ") and "nope" in result.stderr


def test_logs_on_the_memory_adapter_is_unsupported(tmp_path: Path, config: Path) -> None:
    invoke("submit", "--config", config, job(tmp_path, QUICK % "hang"), "--job-id", "l1")
    result = invoke("logs", "--config", config, "l1")
    assert result.exit_code == 1
    assert result.stderr.strip() == "error: cluster 'memory' cannot read job output (capability 'output')"


def test_watch_one_job_ends_with_it(tmp_path: Path, config: Path) -> None:
    invoke("submit", "--config", config, job(tmp_path, QUICK % "sleep 0.2; exit 0"), "--job-id", "w1")
    result = invoke("watch", "--config", config, "w1", "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout.splitlines()[-1])["outcome"]["state"] == "succeeded"


def test_check_prints_capabilities_and_never_the_token(tmp_path: Path, config: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(SECRET + "\n")
    result = invoke("check", "--config", config, "--token-file", token_file)
    assert result.exit_code == 0
    assert "adapter:  memory" in result.stdout and "holds:" in result.stdout
    assert SECRET not in result.stdout + result.stderr
    as_json = json.loads(invoke("check", "--config", config, "--json", "--token-file", token_file).stdout)
    assert as_json["capabilities"]["holds"] is True
    assert SECRET not in json.dumps(as_json)
    assert invoke("open", "--config", config).stdout == result.stdout  # `open` is `check`


def test_the_token_never_shows_in_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_TOKEN", SECRET)
    bad = tmp_path / "bad.yaml"
    bad.write_text("adapter: memory\nsettings: {nodez: 1}\n")
    result = invoke("check", "--config", bad)
    assert result.exit_code == 2
    assert SECRET not in result.stdout + result.stderr


def test_a_token_file_that_is_not_text_is_refused_without_quoting_it(tmp_path: Path, config: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_bytes(b"\xff\xfe" + SECRET.encode())
    result = invoke("check", "--config", config, "--token-file", token_file)
    assert result.exit_code == 2
    assert result.stderr == f"error: {token_file}: the token file is not UTF-8 text\n"
    assert SECRET not in result.stdout + result.stderr


NO_USER = "~no-such-user-dispatch"


@pytest.mark.parametrize("where", ["store", "config", "token", "state"])
def test_a_path_under_an_unknown_user_is_an_error_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    args: list[str | Path] = ["check"]
    if where == "store":
        args += ["--config", job(tmp_path, f"adapter: memory\nstore: {{sqlite: {NO_USER}/j.db}}\n", "c.yaml")]
    elif where == "config":
        args += ["--config", f"{NO_USER}/c.yaml"]
    elif where == "token":
        args += ["--token-file", f"{NO_USER}/token"]
    else:
        monkeypatch.setenv("DISPATCH_STATE_DIR", f"{NO_USER}/state")
    result = invoke(*args)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and "no such user" in result.stderr


def test_schema_of_an_adapter(config: Path) -> None:
    result = invoke("schema", "memory")
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert schema["additionalProperties"] is False and "nodes" in schema["properties"]
    kubeflow = json.loads(invoke("schema", "kubeflow").stdout)
    assert kubeflow["type"] == "object" and kubeflow["additionalProperties"] is False
    missing = invoke("schema", "no-such")
    assert missing.exit_code == 1 and missing.stderr.startswith("error: no adapter named 'no-such'")
    assert "available: kubeflow, memory" in missing.stderr


def test_adapters_lists_registered_and_installed(config: Path) -> None:
    result = invoke("adapters", "--json")
    found = {a["name"]: a for a in json.loads(result.stdout)}
    assert found["memory"]["extensions"] == ["dispatch/Image", "dispatch/SharedCheckpoint"]
    assert found["memory"]["schema"] is True
    assert "kubeflow/RuntimeRef" in found["kubeflow"]["extensions"]
    assert "memory" in invoke("adapters").stdout


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ("adapter: memory\nstorage: {}\n", "storage"),
        ("adapter: memory\nstore: {sqlite: a.db, memory: {}}\n", "store"),
        ("adapter: memory\nstore: {postgres: x}\n", "store.postgres"),
        ("adapter: memory\nreadOnly: 'no'\n", "readOnly"),
        (
            "adapter: memory\npolicy: {rules: {preempted: {action: retry}}}\n",
            'policy.rules["preempted"].action',
        ),
        ("settings: {}\n", "adapter"),
    ],
)
def test_config_files_are_decoded_strictly(tmp_path: Path, text: str, path: str) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text(text)
    result = invoke("check", "--config", cfg)
    assert result.exit_code == 2
    assert f"{path}: " in result.stderr


def test_config_from_the_environment(tmp_path: Path, config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DISPATCH_CONFIG", str(config))
    result = invoke("check", "--json")
    assert json.loads(result.stdout)["config"] == str(config)


def test_usage_errors_exit_2() -> None:
    assert invoke("run").exit_code == 2
    assert invoke("no-such-command").exit_code == 2


def test_common_options_may_come_before_the_command(config: Path) -> None:
    result = invoke("--config", config, "--json", "check")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["config"] == str(config)


def test_config_files_may_be_toml(tmp_path: Path) -> None:
    cfg = tmp_path / "c.toml"
    cfg.write_text(
        'adapter = "memory"\nreadOnly = true\n[settings]\nnodes = 2\n[store]\nmemory = {}\n'
        '[policy.rules.preempted]\naction = "requeue"\nmax = 5\n'
    )
    result = invoke("check", "--config", cfg, "--json")
    assert result.exit_code == 0, result.stderr
    body = json.loads(result.stdout)
    assert body["capabilities"]["mode"] == "read_only" and body["capabilities"]["limits"]["maxNodes"] == 2
    cfg.write_text('adapter = "memory"\nadapter = "x"\n')
    bad = invoke("check", "--config", cfg)
    assert bad.exit_code == 2 and "not valid TOML" in bad.stderr
    cfg.write_text('adapter = "memory"\n[settings]\nwhen = 2026-01-01\n')
    dated = invoke("check", "--config", cfg)
    assert dated.exit_code == 2 and "settings.when" in dated.stderr


@pytest.mark.parametrize(
    "name", ["hello.yaml", "preempted.yaml", "node-lost.yaml", "oom.yaml", "trainjob-hello.yaml"]
)
def test_every_example_job_validates(name: str) -> None:
    # trainjob-hello.yaml carries kubeflow/RuntimeRef: validate imports installed adapters to know it.
    result = invoke("validate", EXAMPLES / name)
    assert result.exit_code == 0, result.stderr


@pytest.mark.parametrize("name", ["memory-cluster.yaml", "kubesim-cluster.yaml"])
def test_every_example_config_decodes(name: str) -> None:
    from dispatch.cli.config import load_config

    cf = load_config(str(EXAMPLES / name))
    assert cf.adapter in ("memory", "kubeflow")
    if cf.adapter == "kubeflow":  # where `python -m kubesim serve` run from the repository's root writes it
        real = load_config(str(ROOT / "examples" / name))
        assert real.settings["kubeconfig"] == str(ROOT / "kubesim.kubeconfig")


# ---------------------------------------------------------------------- errors that say where and what


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("adaptor: memory\n", 'cluster.yaml: adaptor: unknown config key "adaptor"; did you mean "adapter"?'),
        (
            "adapter: memory\nsettings: {nodez: 3}\n",
            'cluster.yaml: settings.nodez: unknown memory setting "nodez"; did you mean "nodes"?',
        ),
        (
            "adapter: kubeflow\nsettings: {namespace: Bad_NS}\n",
            "cluster.yaml: settings.namespace: 'Bad_NS' is not a DNS-1123 label",
        ),
        ("adapter: kubeflow\nsettings: {probewindow: 10s}\n", 'did you mean "probeWindow"?'),
        (
            "adapter: memory\nstore: {sqlite: j.db}\nreadonly: true\n",
            'cluster.yaml: readonly: unknown config key "readonly"; did you mean "readOnly"?',
        ),
    ],
)
def test_config_errors_name_the_file_the_path_and_the_nearest_key(
    tmp_path: Path, text: str, expected: str
) -> None:
    result = invoke("--config", job(tmp_path, text, "cluster.yaml"), "check")
    assert result.exit_code == 2
    assert expected in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_job_file_errors_name_the_nearest_field(tmp_path: Path) -> None:
    result = invoke("validate", job(tmp_path, "command: [x]\nnode: 2\n"))
    assert result.exit_code == 2
    assert 'job.yaml: node: unknown field "node"; did you mean "nodes"?' in result.stderr


@pytest.mark.parametrize("what", ["job", "config"])
def test_files_over_one_mebibyte_are_refused_unread(tmp_path: Path, what: str) -> None:
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * (1 << 20) + "\n")
    args = ["validate", str(big)] if what == "job" else ["--config", str(big), "check"]
    result = invoke(*args)
    assert result.exit_code == 2
    assert "larger than 1024 KiB" in result.stderr and "big.yaml" in result.stderr


def test_a_relative_kubeconfig_resolves_from_the_config_file(tmp_path: Path) -> None:
    from dispatch.cli.config import load_config

    sub = tmp_path / "clusters"
    sub.mkdir()
    (sub / "c.yaml").write_text("adapter: kubeflow\nsettings: {kubeconfig: kc.yaml}\n")
    cf = load_config(str(sub / "c.yaml"), environ={})
    assert cf.settings["kubeconfig"] == str(sub.resolve() / "kc.yaml")
    (sub / "abs.yaml").write_text("adapter: kubeflow\nsettings: {kubeconfig: /etc/kc.yaml}\n")
    assert load_config(str(sub / "abs.yaml"), environ={}).settings["kubeconfig"] == "/etc/kc.yaml"


def test_a_kubeconfig_under_home_is_expanded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``~/…`` names the home directory's file (it was kept as written, and no file is called ``~``)."""
    from dispatch.cli.config import load_config

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "c.yaml").write_text("adapter: kubeflow\nsettings: {kubeconfig: ~/.kube/dev}\n")
    cf = load_config(str(tmp_path / "c.yaml"), environ={})
    assert cf.settings["kubeconfig"] == str(tmp_path / "home" / ".kube" / "dev")


# ---------------------------------------------------------------------- every failure is one line


def test_dispatch_token_is_stripped_like_the_token_file(monkeypatch: pytest.MonkeyPatch) -> None:
    from dispatch.cli.config import read_token

    assert read_token(environ={"DISPATCH_TOKEN": f"  {SECRET}\n"}) == SECRET
    assert read_token(environ={"DISPATCH_TOKEN": " \n"}) is None


@pytest.mark.parametrize("source", ["env", "file"])
@pytest.mark.parametrize("bad", [f"{SECRET}\nX-Evil: 1", f"{SECRET} more", f"{SECRET}\x00", f"{SECRET}é"])
def test_a_token_that_cannot_go_in_a_header_is_refused_without_echo(
    tmp_path: Path, config: Path, monkeypatch: pytest.MonkeyPatch, source: str, bad: str
) -> None:
    args: list[str | Path] = ["check", "--config", config]
    if source == "env":
        if "\x00" in bad:
            bad = bad.replace("\x00", "\x01")  # an environment variable cannot hold a NUL
        monkeypatch.setenv("DISPATCH_TOKEN", bad)
    else:
        (tmp_path / "token").write_text(bad)
        args += ["--token-file", tmp_path / "token"]
    result = invoke(*args)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "cannot be sent in an HTTP header" in result.stderr
    assert SECRET not in result.stdout + result.stderr


@pytest.mark.parametrize(
    "text",
    ["command: !!bool 9\n", "command: [x]\nnodes: !!int ''\n", "command: !!timestamp 1\n",
     "!!map [command, x]\n", "command: [x]\nnodes: !!int x\n", "command: [x]\nnodes: 1:30\n",
     "command: [x]\nnodes: 0x" + "f" * 5000 + "\n", "command: [x]\nnodes: " + "9" * 5000 + "\n",
     "a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
     "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
     "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
     "command: [*f]\n"],
)  # fmt: skip
def test_a_hostile_job_file_is_one_line_and_exit_2(tmp_path: Path, text: str) -> None:
    result = invoke("validate", job(tmp_path, text))
    assert result.exit_code == 2, result.stderr
    assert result.stderr.startswith("error: ") and result.stderr.count("\n") == 1, result.stderr


def test_a_nul_in_the_store_path_is_one_line_and_exit_2(tmp_path: Path) -> None:
    conf = tmp_path / "c.json"
    conf.write_text(json.dumps({"adapter": "memory", "store": {"sqlite": "a\u0000b.db"}}))
    result = invoke("check", "--config", conf)
    assert result.exit_code == 2, result.stderr
    assert result.stderr == f"error: {conf}: store.sqlite: a file path cannot contain a NUL character\n"


def test_a_defect_below_the_cli_is_one_line_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever escapes from below (here an adapter whose factory has a bug, quoting the token) is
    one line, with the token cut out, and exit code 1 — never a traceback."""
    import dispatch

    async def broken_factory(config: dispatch.AdapterConfig) -> object:
        raise RuntimeError(f"adapter exploded near {config.token}")

    dispatch.register("broken-for-cli-test", broken_factory)
    conf = job(tmp_path, "adapter: broken-for-cli-test\nstore: {memory: {}}\n", "c.yaml")
    monkeypatch.setenv("DISPATCH_TOKEN", SECRET)
    result = invoke("check", "--config", conf)
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1
    assert result.stderr.startswith("error: unexpected RuntimeError: adapter exploded near ***")
    assert SECRET not in result.stdout + result.stderr
