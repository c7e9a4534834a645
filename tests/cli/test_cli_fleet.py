"""A fleet of clusters through the CLI (SPEC §15): the config file's `placement:` and its errors, `dispatch
clusters`, `run`/`submit --cluster`, and `status`/`list`/`history`/`describe` naming the cluster of each
incarnation; `supervise` over a fleet.

Two named memory clusters (shared by every command of this process) with one SQLite store; a third
cluster whose adapter is not installed stands for one that cannot be opened.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner, Result

from dispatch import SystemClock
from dispatch.cli.commands import cli
from dispatch.memory import MemoryCluster, parse_settings
from dispatch.memory.cluster import shared_cluster

ROOT = Path(__file__).resolve().parents[2]
JOB = (
    "command: [python, train.py]\nenv: {KUBESIM_SCRIPT: '%s'}\n"
    "extensions:\n  dispatch/Image: {ref: 'pytorch/pytorch:2.5'}\n"
)
PREEMPT_ONCE = "env:DISPATCH_EPOCH=1.0: sleep 1; env:DISPATCH_EPOCH=1.0: preempt; sleep 1; exit 0"
ELSEWHERE = "{rules: {preempted: {action: requeue, max: 2, backoff: 0.5, elsewhere: true}}}"


class Fleet:
    """A fleet config file of memory clusters ``a`` and ``b`` (and, with ``down``, ``c``, which cannot
    be opened), and the commands run on it."""

    def __init__(self, tmp_path: Path, *, down: bool = False, placement: str = "{order: [a, b]}") -> None:
        self.tmp = tmp_path
        tag = uuid.uuid4().hex[:10]
        self.settings = {
            n: f'{{"cluster": "fleet-{tag}-{n}", "startDelay": 0, "cessationDelay": 0.2}}' for n in "ab"
        }
        lines = [
            "clusters:",
            f"  a: {{adapter: memory, settings: {self.settings['a']}, store: {{sqlite: jobs.db}}, "
            f"checkpoints: nfs, policy: {ELSEWHERE}}}",
            f"  b: {{adapter: memory, settings: {self.settings['b']}, checkpoints: nfs}}",
        ]
        if down:
            lines.append("  c: {adapter: not-installed-anywhere}")
            placement = placement.replace("[a, b]", "[a, b, c]")
        lines.append(f"placement: {placement}")
        self.path = tmp_path / "fleet.yaml"
        self.path.write_text("\n".join(lines) + "\n")

    def cluster(self, name: str) -> MemoryCluster:
        """The memory cluster ``name`` of this process (the one the commands open)."""
        return shared_cluster(parse_settings(self.settings[name]), SystemClock())

    def __call__(self, *args: str | Path) -> Result:
        return CliRunner().invoke(
            cli, ["--config", str(self.path), *(str(a) for a in args)], catch_exceptions=False
        )

    def job(self, script: str, name: str = "job.yaml") -> Path:
        path = self.tmp / name
        path.write_text(JOB % script)
        return path

    def json(self, *args: str | Path) -> object:
        result = self(*args, "-o", "json")
        assert result.exit_code == 0, result.stdout + result.stderr
        return json.loads(result.stdout)


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("DISPATCH_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("DISPATCH_CONFIG", raising=False)
    monkeypatch.delenv("DISPATCH_TOKEN", raising=False)
    yield


# ---------------------------------------------------------------------------------- the config file


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "clusters:\n  a: {adapter: memory, store: {sqlite: one.db}}\n  b: {adapter: memory, store: {sqlite: two.db}}\n"
            "placement: {order: [a, b]}\n",
            'fleet.yaml: clusters["b"].store: a fleet shares one store: clusters["a"] and clusters["b"] name '
            "sqlite:one.db and sqlite:two.db; give every cluster the same store, or name it in one and leave it "
            "out of the others",
        ),
        (
            "clusters:\n  a: {adapter: memory, policy: {default: fail}}\n  b: {adapter: memory, policy: {default: hold}}\n"
            "placement: {order: [a, b]}\n",
            'fleet.yaml: clusters["b"].policy: a fleet shares one policy',
        ),
        (
            "clusters:\n  a: {adapter: memory}\n  b: {adapter: memory}\nplacement: {order: [a]}\n",
            "fleet.yaml: placement.order: every cluster of the fleet must be in it; missing: b",
        ),
        (
            "clusters:\n  a: {adapter: memory}\nplacement: {order: [a, z]}\n",
            "fleet.yaml: placement.order[1]: no cluster 'z' in this file; it names: a",
        ),
        (
            "clusters:\n  a: {adapter: memory}\nplacement: {}\n",
            "fleet.yaml: placement: give `order: [a]` (tried in that order) or `weights: {NAME: W, ...}`",
        ),
        (
            "clusters:\n  a: {adapter: memory}\n  b: {adapter: memory}\nplacement: {weights: {a: 1, b: -2}}\n",
            'fleet.yaml: placement.weights["b"]: must be more than 0',
        ),
        (
            "clusters:\n  a: {adapter: memory}\nplacement: {order: [a], patience: 0}\n",
            "fleet.yaml: placement.patience: must be more than 0",
        ),
        (
            "clusters:\n  'a,b': {adapter: memory}\nplacement: {weights: {'a,b': 1}}\n",
            "fleet.yaml: clusters[\"a,b\"]: 'a,b' cannot name a cluster of a fleet",
        ),
        (
            "clusters:\n  a: {adapter: memory, chekpoints: nfs}\nplacement: {order: [a]}\n",
            'fleet.yaml: clusters["a"].chekpoints: unknown config key "chekpoints"; did you mean "checkpoints"?',
        ),
        (
            "clusters:\n  a: {adapter: memory, settings: {nodez: 2}}\nplacement: {order: [a]}\n",
            'fleet.yaml: clusters["a"].settings.nodez: unknown memory setting "nodez"; did you mean "nodes"?',
        ),
        (
            "clusters:\n  a: {adapter: memory}\nplacement: {order: [a]}\ndefault: a\n",
            'fleet.yaml: default: unknown config key "default"',
        ),
        (
            "clusters:\n  a: {adapter: memory, checkpoints: nfs}\ndefault: a\n",
            'fleet.yaml: clusters["a"].checkpoints: unknown config key "checkpoints"',
        ),
    ],
)
def test_a_wrong_fleet_config_names_the_file_the_path_and_what_is_allowed(
    tmp_path: Path, text: str, expected: str
) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    result = CliRunner().invoke(cli, ["--config", str(path), "list"])
    assert result.exit_code == 2, result.stdout
    assert result.stderr.startswith(f"error: {tmp_path}/"), result.stderr
    assert expected in result.stderr, result.stderr


def test_the_fleet_config_schema_is_closed_and_the_example_fits_it() -> None:
    from dispatch.cli.fleetconfig import fleet_schema, parse
    from dispatch.model import load_yaml

    doc = fleet_schema()
    jsonschema.Draft202012Validator.check_schema(doc)
    assert doc["required"] == ["clusters", "placement"]
    example = (ROOT / "examples" / "memory-fleet.yaml").read_text()
    jsonschema.Draft202012Validator(doc).validate(load_yaml(example))
    fc = parse(example, source="memory-fleet.yaml")
    assert fc.names == ["east", "west"] and fc.policy.rules  # the decoder agrees
    for wrong in ({"clusters": {"a": {"adapter": "memory"}}}, {"clusters": {}, "placement": {"order": []}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.Draft202012Validator(doc).validate(wrong)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(doc).validate(
            {"clusters": {"a": {"adapter": "memory"}}, "placement": {"weights": {"a": 0}}}
        )


# ---------------------------------------------------------------------------------- dispatch clusters


def test_clusters_shows_each_one_and_says_since_when_one_cannot_be_reached(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, down=True)
    assert fleet("submit", fleet.job("sleep 60; exit 0"), "--job-id", "j1").exit_code == 0
    rows = fleet.json("clusters")
    assert isinstance(rows, list)
    by = {r["name"]: r for r in rows}
    assert [r["name"] for r in rows] == ["a", "b", "c"]
    assert by["a"]["adapter"] == "memory" and by["a"]["identity"] == fleet.cluster("a").id
    assert by["a"]["reachable"] and by["a"]["checkpoints"] == "nfs"
    assert (by["a"]["jobs"], by["a"]["unfinished"], by["b"]["jobs"]) == (1, 1, 0)
    assert by["a"]["capabilities"]["limits"] == {"maxNodes": 4}
    assert not by["c"]["reachable"] and by["c"]["adapter"] == "not-installed-anywhere"
    assert "NotFoundError: no adapter named 'not-installed-anywhere'" in by["c"]["unreachable"]["reason"]
    since = by["c"]["unreachable"]["since"]
    again = fleet.json("clusters")
    assert isinstance(again, list) and again[2]["unreachable"]["since"] == since  # kept in the store

    fleet.cluster("b").outage(60)
    text = fleet("clusters")
    assert text.exit_code == 0, text.stderr
    header, a, b, c = text.stdout.splitlines()
    assert header.split() == [
        "CLUSTER",
        "ADAPTER",
        "IDENTITY",
        "REACHABLE",
        "CHECKPOINTS",
        "JOBS",
        "CAPABILITIES",
    ]
    assert a.split()[:4] == ["a", "memory", fleet.cluster("a").id, "yes"]
    assert "1 (1 unfinished)" in a and "up to 4 nodes" in a
    assert b.split()[:5] == ["b", "memory", fleet.cluster("b").id, "no,", "since"]
    assert "the memory cluster does not answer (outage)" in b
    assert c.startswith("c ") and "(not known yet)" in c
    only = fleet.json("--cluster", "b", "clusters")
    assert [r["name"] for r in only] == ["b"]  # type: ignore[index, union-attr]


# ---------------------------------------------------------------------------------- placing a job


def test_run_and_submit_with_cluster_restrict_the_job_to_those(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    ran = fleet("run", fleet.job("sleep 1; exit 0"), "--job-id", "r1", "--cluster", "b")
    assert ran.exit_code == 0, ran.stdout + ran.stderr
    assert "submitted  pending  — placed on b: the first that takes it" in ran.stdout
    assert "started  on b  — memory:r1-1-" in ran.stdout
    rec = fleet.json("status", "r1")
    assert isinstance(rec, dict)
    assert (rec["clusters"], rec["cluster"], rec["clusterName"]) == (["b"], fleet.cluster("b").id, "b")

    both = fleet("submit", fleet.job("sleep 60; exit 0"), "--job-id", "s1", "--cluster", "b,a")
    assert both.exit_code == 0, both.stderr
    rec = fleet.json("status", "s1")
    assert isinstance(rec, dict)
    assert (rec["clusters"], rec["clusterName"]) == (["b", "a"], "a")  # the configured order decides
    plain = fleet("submit", fleet.job("sleep 60; exit 0"), "--job-id", "s2")
    assert plain.exit_code == 0 and "clusters" not in fleet.json("status", "s2")  # type: ignore[operator]

    unknown = fleet("submit", fleet.job("sleep 1"), "--cluster", "z")
    assert unknown.exit_code == 2
    assert unknown.stderr == f"error: --cluster: no cluster 'z' in {fleet.path}; it names: a, b\n"
    empty = fleet("submit", fleet.job("sleep 1"), "--cluster", "a,")
    assert empty.exit_code == 2 and "--cluster 'a,': expected cluster names, comma-separated" in empty.stderr
    on_status = fleet("--cluster", "a", "status", "s1")
    assert on_status.exit_code == 2
    assert (
        "--cluster: a: in a fleet" in on_status.stderr
        and "`status` works on the whole fleet" in on_status.stderr
    )


def test_run_restricted_to_a_cluster_that_is_down_waits_for_it(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    fleet("clusters")  # both open once: their identities are known to the store
    fleet.cluster("a").outage(3)
    ran = fleet("run", fleet.job("sleep 1; exit 0"), "--job-id", "w1", "--cluster", "a")
    assert ran.exit_code == 0, ran.stdout + ran.stderr
    assert "submitted  pending  — waits for a: no cluster of a takes it now (a: unreachable" in ran.stdout
    assert "started  on a" in ran.stdout and " on b" not in ran.stdout


def test_several_clusters_are_a_fleets_not_a_profiles_files(tmp_path: Path) -> None:
    path = tmp_path / "profiles.yaml"
    path.write_text("clusters:\n  a: {adapter: memory}\n  b: {adapter: memory}\ndefault: a\n")
    result = CliRunner().invoke(cli, ["--config", str(path), "--cluster", "a,b", "list"])
    assert result.exit_code == 2
    assert (
        "--cluster: a,b: a config names one cluster, or profiles of which a command uses one" in result.stderr
    )


# ---------------------------------------------------------------------------------- the cluster of each


def test_a_job_requeued_elsewhere_names_both_clusters_everywhere(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    ran = fleet("run", fleet.job(PREEMPT_ONCE), "--job-id", "p1")
    assert ran.exit_code == 0, ran.stdout + ran.stderr
    assert "started  on a" in ran.stdout and "started  on b" in ran.stdout

    history = fleet("history", "p1")
    assert history.exit_code == 0, history.stderr
    out = history.stdout
    assert (
        "p1@2.1  supervisor  placed  — placed on b: the first other cluster that takes it; passed over a: "
        "the previous incarnation ran there (requeue elsewhere); its checkpoints follow (a and b see nfs)"
        in out
    )
    incarnations = out.split("incarnations:\n", 1)[1].splitlines()
    assert incarnations[0].startswith("  1 (p1@1.0): failed / preempted on a  — requeued as 2.1")
    assert incarnations[1] == "  2 (p1@2.1): succeeded / none on b"

    described = fleet("describe", "p1")
    assert described.exit_code == 0, described.stderr
    timeline = described.stdout.split("incarnations:\n", 1)[1]
    one, two = timeline.split("  2.1  ", 1)
    assert f"    cluster: a ({fleet.cluster('a').id})" in one
    assert f"    cluster: b ({fleet.cluster('b').id})" in two
    assert f"cluster: b ({fleet.cluster('b').id})" in described.stdout.split("spec:", 1)[0]
    as_json = fleet.json("describe", "p1")
    assert isinstance(as_json, dict)
    assert [(i["cluster"], i["clusterName"]) for i in as_json["incarnations"]] == [
        (fleet.cluster("a").id, "a"),
        (fleet.cluster("b").id, "b"),
    ]

    listed = fleet("list")
    header, row = listed.stdout.splitlines()
    assert header.split() == ["JOB", "STATE", "CAUSE", "CLUSTER", "EPOCH", "UPDATED"]
    assert row.split()[:5] == ["p1", "succeeded", "none", "b", "2.1"]
    assert [r["clusterName"] for r in fleet.json("list")] == ["b"]  # type: ignore[index, union-attr]
    assert fleet("list", "--cluster", "a").stdout.splitlines()[1:] == []  # its current incarnation is on b


def test_a_job_whose_cluster_cannot_be_opened_is_shown_as_last_known(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    assert fleet("submit", fleet.job("sleep 60; exit 0"), "--job-id", "j1", "--cluster", "b").exit_code == 0
    # The same fleet, b's adapter now missing: its job stays as it was, and says why.
    fleet.path.write_text(
        fleet.path.read_text().replace("b: {adapter: memory,", "b: {adapter: gone-adapter,")
    )
    status = fleet("status", "j1")
    assert status.exit_code == 0, status.stderr
    assert "cluster: b: cluster b unreachable since" in status.stdout
    assert "NotFoundError: no adapter named 'gone-adapter'" in status.stdout
    assert "shown as last known" in status.stdout
    listed = fleet("list")
    assert "j1" in listed.stdout and "(last known)" in listed.stdout
    assert "note: cluster b unreachable since" in listed.stderr
    cancel = fleet("cancel", "j1")
    assert cancel.exit_code == 1 and "cluster b unreachable" in cancel.stderr


# ---------------------------------------------------------------------------------- supervise


def test_supervise_supervises_every_cluster_of_the_fleet(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path, down=True)
    assert fleet("submit", fleet.job("sleep 1; exit 0"), "--job-id", "x", "--cluster", "b").exit_code == 0
    once = fleet("supervise", "--once", "--poll", "0.1", "--lease", "5", "--holder", "h")
    assert once.exit_code == 0, once.stdout + once.stderr
    first = once.stdout.splitlines()[0]
    assert first.startswith("supervisor a=h/a, b=h/b on the fleet a, b, c (sqlite:")
    assert (
        "cluster c cannot be opened (NotFoundError: no adapter named 'not-installed-anywhere'" in once.stdout
    )
    assert "tried again every 15 s" in once.stdout
    only = fleet(
        "--cluster",
        "b",
        "supervise",
        "--once",
        "--poll",
        "0.1",
        "--lease",
        "5",
        "--holder",
        "h",
        "-o",
        "json",
    )
    assert only.exit_code == 0, only.stdout + only.stderr
    started = json.loads(only.stdout.splitlines()[0])
    assert (started["supervisor"], started["adapter"]) == ("b=h/b", {"fleet": ["b"]})


def test_supervise_requeues_a_job_preempted_on_one_cluster_onto_the_other(tmp_path: Path) -> None:
    """`submit` places it on a; only `supervise` (one step at a time) carries it on: preempted there, its
    next incarnation placed on b once a's compute is gone, where it succeeds."""
    fleet = Fleet(tmp_path)
    assert fleet("submit", fleet.job(PREEMPT_ONCE), "--job-id", "p").exit_code == 0
    said = []
    for _ in range(2000):  # one step each; the job's own time (its script's sleeps) decides how many
        step = fleet("supervise", "--once", "--poll", "0.1", "--lease", "5", "--holder", "h")
        assert step.exit_code == 0, step.stdout + step.stderr
        said.append(step.stdout)
        rec = fleet.json("status", "p")
        assert isinstance(rec, dict)
        if rec["outcome"]["state"] == "succeeded":
            break
    else:
        raise AssertionError(f"not succeeded after 2000 steps: {rec}")
    assert (rec["epoch"], rec["clusterName"]) == ("2.1", "b")
    actions = "".join(said)
    assert "p@1.0: requeue (policy rule preempted: " in actions and ", on another cluster, " in actions
    assert "p@2.1: placed on b: the first other cluster that takes it" in actions
    history = fleet("history", "p").stdout
    assert "placed on b: the first other cluster that takes it" in history
    incarnations = history.split("incarnations:\n", 1)[1].splitlines()
    assert incarnations[0].startswith("  1 (p@1.0): failed / preempted on a")
    assert incarnations[1] == "  2 (p@2.1): succeeded / none on b"


def test_validate_says_where_the_fleet_would_place_the_job_and_why_no_cluster_takes_it(
    tmp_path: Path,
) -> None:
    tag = uuid.uuid4().hex[:10]
    config = tmp_path / "fleet.yaml"
    config.write_text(
        "clusters:\n"
        f"  a: {{adapter: memory, settings: {{cluster: v-{tag}-a}}, store: {{sqlite: jobs.db}}}}\n"
        f"  b: {{adapter: memory, settings: {{cluster: v-{tag}-b, nodes: 8}}}}\n"
        "placement: {order: [a, b]}\n"
    )

    def validate(nodes: int, *more: str) -> Result:
        job = tmp_path / f"job-{nodes}.yaml"
        job.write_text(
            f"command: [python, train.py]\nnodes: {nodes}\nextensions:\n  dispatch/Image: {{ref: 'x:1'}}\n"
        )
        return CliRunner().invoke(cli, ["--config", str(config), "validate", str(job), *more])

    one = validate(1)
    assert one.exit_code == 0, one.stderr
    assert f"ok: the fleet ({config}) would have it placed on a: the first that takes it" in one.stdout
    six = validate(6)
    assert six.exit_code == 0, six.stderr
    assert (
        "placed on b: the first that takes it; passed over a: does not take this job (the job asks for 6 "
        'nodes; this memory cluster has 4 (setting "nodes"))' in six.stdout
    )
    assert "placed on b" in validate(1, "--cluster", "b").stdout
    only_a = validate(6, "--cluster", "a")
    assert only_a.exit_code == 1
    assert "job-6.yaml: a does not take this job (the job asks for 6 nodes" in only_a.stderr
    big = validate(64)
    assert big.exit_code == 1 and "error: 2 reasons:" in big.stderr
    assert "b does not take this job (the job asks for 64 nodes; this memory cluster has 8" in big.stderr
    listed = CliRunner().invoke(cli, ["--config", str(config), "list", "-o", "json"])
    assert listed.exit_code == 0 and json.loads(listed.stdout) == []  # validate wrote no record


def test_clusters_of_a_config_naming_one_and_of_the_embedded_default_with_its_dev_cluster_stopped(
    tmp_path: Path,
) -> None:
    one = tmp_path / "one.yaml"
    one.write_text(
        f"adapter: memory\nsettings: {{cluster: one-{uuid.uuid4().hex[:10]}}}\nstore: {{sqlite: one.db}}\n"
    )
    rows = json.loads(CliRunner().invoke(cli, ["--config", str(one), "clusters", "-o", "json"]).stdout)
    assert [(r["name"], r["adapter"], r["reachable"], r["jobs"]) for r in rows] == [
        ("one", "memory", True, 0)
    ]
    assert rows[0]["capabilities"]["limits"] == {"maxNodes": 4}
    # No config, no dev cluster running: said, and since when; nothing is started to answer.
    dev = CliRunner().invoke(cli, ["clusters"])
    assert dev.exit_code == 0, dev.stderr
    _, row = dev.stdout.splitlines()
    assert row.startswith("dev cluster  kubeflow  (not known yet)  no, since "), row
    assert "the dev cluster is not running (`dispatch dev-cluster start` starts a new, empty one)" in row
    assert not (tmp_path / "state" / "dev-cluster" / "state.json").exists()
