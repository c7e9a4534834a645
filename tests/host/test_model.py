"""Strict decoding of the model, as users meet it in job files (JSON and YAML): one test per refusal
kind, each naming the exact path; extension round trips; the epoch bound; reserved env names."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from dispatch import (
    ENV_PREFIX,
    EPOCH_BOUND,
    Epoch,
    Extension,
    Extensions,
    Identity,
    Image,
    InvalidError,
    JobSpec,
    OpaqueExtension,
    Outcome,
    Policy,
    SharedCheckpoint,
    register_extension,
)
from dispatch.model import BUCKETS, Share, bucket, load_json, load_yaml
from dispatch.model._decode import Fields, as_int


def both(json_text: str, yaml_text: str) -> list[tuple[str, str]]:
    return [("json", json_text), ("yaml", yaml_text)]


def refused_spec(fmt: str, text: str) -> InvalidError:
    with pytest.raises(InvalidError) as info:
        JobSpec.loads(text, format=fmt)
    return info.value


@pytest.mark.parametrize(
    ("fmt", "text"),
    both(
        '{"command": ["x"], "extensions": {"dispatch/Image": {"ref": "i", "tag": "t"}}}',
        "command: [x]\nextensions:\n  dispatch/Image: {ref: i, tag: t}\n",
    ),
)
def test_unknown_field_is_refused_at_its_path(fmt: str, text: str) -> None:
    err = refused_spec(fmt, text)
    assert err.path == 'extensions["dispatch/Image"].tag'
    assert 'extensions["dispatch/Image"].tag' in str(err)
    assert "allowed: ref" in str(err)


@pytest.mark.parametrize(
    ("fmt", "text"),
    both('{"command": ["x"], "nodez": 2}', "command: [x]\nnodez: 2\n"),
)
def test_unknown_top_level_field_is_refused(fmt: str, text: str) -> None:
    assert refused_spec(fmt, text).path == "nodez"


@pytest.mark.parametrize(
    ("fmt", "text"),
    both(
        '{"rules": {"preempted": {"action": "retry"}}}',
        "rules:\n  preempted: {action: retry}\n",
    ),
)
def test_unknown_enum_name_is_refused_at_its_path(fmt: str, text: str) -> None:
    raw = load_json(text) if fmt == "json" else load_yaml(text)
    with pytest.raises(InvalidError) as info:
        Policy.from_json(raw)
    assert info.value.path == 'policy.rules["preempted"].action'
    assert '"retry"' in str(info.value) and '"requeue"' in str(info.value)


@pytest.mark.parametrize(("fmt", "text"), both('{"state": "done"}', "state: done\n"))
def test_unknown_state_is_refused(fmt: str, text: str) -> None:
    raw = load_json(text) if fmt == "json" else load_yaml(text)
    with pytest.raises(InvalidError) as info:
        Outcome.from_json(raw, "outcome")
    assert info.value.path == "outcome.state"


@pytest.mark.parametrize(
    ("fmt", "text"),
    both('{"rules": {"preemptd": "fail"}}', "rules: {preemptd: fail}\n"),
)
def test_unknown_cause_is_refused(fmt: str, text: str) -> None:
    raw = load_json(text) if fmt == "json" else load_yaml(text)
    with pytest.raises(InvalidError) as info:
        Policy.from_json(raw)
    assert info.value.path == 'policy.rules["preemptd"]'


@pytest.mark.parametrize(
    ("fmt", "text", "path"),
    [
        ("json", '{"command": ["x"], "timeLimit": null}', "timeLimit"),
        ("yaml", "command: [x]\ntimeLimit: null\n", "timeLimit"),
        ("yaml", "command: [x]\ntimeLimit:\n", "timeLimit"),
        (
            "json",
            '{"command": ["x"], "extensions": {"acme/Thing": {"a": [1, null]}}}',
            'extensions["acme/Thing"].a[1]',
        ),
        ("yaml", "command: [x]\nextensions:\n  acme/Thing: {a: [1, ~]}\n", 'extensions["acme/Thing"].a[1]'),
    ],
)
def test_null_is_refused_at_its_path(fmt: str, text: str, path: str) -> None:
    err = refused_spec(fmt, text)
    assert err.path == path
    assert "null" in str(err)


@pytest.mark.parametrize(
    ("fmt", "text"),
    both('{"command": ["x"], "env": {"A": "1", "A": "2"}}', "command: [x]\nenv:\n  A: '1'\n  A: '2'\n"),
)
def test_duplicate_key_is_refused_at_its_path(fmt: str, text: str) -> None:
    err = refused_spec(fmt, text)
    assert err.path == "env"
    assert 'duplicate key "A"' in str(err)


@pytest.mark.parametrize(
    ("fmt", "text"),
    both('{"command": ["x"]} {"nodes": 2}', "command: [x]\n---\nnodes: 2\n"),
)
def test_trailing_data_is_refused(fmt: str, text: str) -> None:
    err = refused_spec(fmt, text)
    assert err.path == "job spec"
    assert "trailing data" in str(err) or "exactly one YAML document" in str(err)


@pytest.mark.parametrize(
    ("fmt", "text", "path", "expected"),
    [
        ("json", '{"command": ["x"], "nodes": "2"}', "nodes", "expected an integer, got a string"),
        ("yaml", "command: [x]\nnodes: '2'\n", "nodes", "expected an integer, got a string"),
        ("json", '{"command": ["x", 3]}', "command[1]", "expected a string, got an integer"),
        ("yaml", "command: [x, 3]\n", "command[1]", "expected a string, got an integer"),
        ("yaml", "command: python train.py\n", "command", "expected a list, got a string"),
        ("yaml", "command: [x]\nenv: {A: 1}\n", 'env["A"]', "expected a string, got an integer"),
    ],
)
def test_wrong_type_is_refused_at_its_path(fmt: str, text: str, path: str, expected: str) -> None:
    err = refused_spec(fmt, text)
    assert err.path == path
    assert expected in str(err)


def test_yaml_timestamps_and_unquoted_words_stay_what_the_schema_says() -> None:
    spec = JobSpec.loads("command: [echo, 2026-01-01, 'yes']\n", format="yaml")
    assert spec.command == ("echo", "2026-01-01", "yes")


@register_extension
@dataclass(frozen=True, slots=True)
class Accelerator(Extension):
    """A test extension type registered the way an adapter registers its own."""

    NAME: ClassVar[str] = "test.dispatch/Accelerator"
    kind: str
    count: int = 1

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "count": self.count}

    @classmethod
    def from_json(cls, value: Any, path: str) -> Accelerator:
        f = Fields(value, path)
        out = cls(f.required("kind", lambda v, p: str(v)), f.optional("count", as_int, 1))
        f.done()
        return out


@pytest.mark.parametrize("fmt", ["json", "yaml"])
def test_extensions_round_trip_typed_and_opaque(fmt: str) -> None:
    spec = JobSpec(
        command=("python", "train.py"),
        nodes=2,
        procs_per_node=4,
        env={"LR": "0.1"},
        time_limit=3600,
        extensions=Extensions(
            [
                Image("pytorch/pytorch:2.5"),
                SharedCheckpoint("/ckpt/run-1"),
                Accelerator("h100", 8),
                OpaqueExtension("acme/Gpu", {"count": 8, "models": ["a", "b"]}),
            ]
        ),
    )
    text = json.dumps(spec.to_json())
    if fmt == "yaml":
        import yaml

        text = yaml.safe_dump(spec.to_json())
    back = JobSpec.loads(text, format=fmt)
    assert back == spec
    assert back.extensions[Accelerator] == Accelerator("h100", 8)
    assert back.extensions[Image].ref == "pytorch/pytorch:2.5"
    assert back.extensions.opaque() == ["acme/Gpu"]
    assert isinstance(back.extensions["acme/Gpu"], OpaqueExtension)
    assert back.to_json()["extensions"]["acme/Gpu"] == {"count": 8, "models": ["a", "b"]}


def test_at_most_one_value_per_extension_name() -> None:
    with pytest.raises(InvalidError) as info:
        Extensions([Image("a"), Image("b")])
    assert info.value.path == 'extensions["dispatch/Image"]'


def test_epoch_bound() -> None:
    top = Epoch(EPOCH_BOUND - 1, 0)
    with pytest.raises(InvalidError):
        top.requeued()
    with pytest.raises(InvalidError):
        top.resubmitted()
    assert Epoch(EPOCH_BOUND - 2, 5).requeued() == Epoch(EPOCH_BOUND - 1, 6)
    with pytest.raises(InvalidError) as info:
        Epoch(EPOCH_BOUND, 0)
    assert info.value.path == "epoch.n"
    with pytest.raises(InvalidError) as info:
        Epoch.parse(f"{EPOCH_BOUND}.0")
    assert info.value.path == "epoch"
    assert str(Epoch(3, 1)) == "3.1" and Epoch.parse("3.1") == Epoch(3, 1)
    assert Epoch(1, 0).resubmitted() == Epoch(2, 0)
    assert Epoch(2, 1).requeued() == Epoch(3, 2)


def test_identity_env_is_what_the_job_sees() -> None:
    assert Identity("j", Epoch(2, 1)).env() == {"DISPATCH_JOB_ID": "j", "DISPATCH_EPOCH": "2.1"}


@pytest.mark.parametrize(
    ("fmt", "text"),
    both(
        '{"command": ["x"], "env": {"DISPATCH_EPOCH": "9.9"}}', "command: [x]\nenv: {DISPATCH_EPOCH: '9.9'}\n"
    ),
)
def test_reserved_env_names_are_refused(fmt: str, text: str) -> None:
    err = refused_spec(fmt, text)
    assert err.path == 'env["DISPATCH_EPOCH"]'
    assert ENV_PREFIX in str(err) and "reserved" in str(err)


def test_env_names_must_be_variable_names() -> None:
    with pytest.raises(InvalidError) as info:
        JobSpec(command=("x",), env={"A B": "1"})
    assert info.value.path == 'env["A B"]'


@pytest.mark.parametrize("bad", ["", "-leading-dash", "has space", "x" * 254, ["job-a"], 7, None])
def test_a_job_id_is_checked_the_same_after_valid_ones_were_seen(bad: object) -> None:
    from dispatch.model import check_job_id

    for _ in range(3):  # the valid ids seen are remembered; the answer never changes
        assert check_job_id("job-a") == "job-a"
        with pytest.raises(InvalidError):
            check_job_id(bad)


def test_a_fleet_splits_every_bucket_once_among_its_members() -> None:
    members = ("sup-a", "sup-b", "sup-c")
    shares = [Share.of(m, members) for m in members]
    assert set().union(*(s.buckets for s in shares)) == set(range(BUCKETS))
    assert sum(len(s.buckets) for s in shares) == BUCKETS  # no bucket in two shares
    assert all(len(s.buckets) > BUCKETS / 4 for s in shares)  # about a third each
    jobs = [f"job-{i}" for i in range(300)]
    assert all(sum(s.holds(j) for s in shares) == 1 for j in jobs)
    # A member leaving moves only its own buckets: the others keep theirs.
    after = [Share.of(m, members[1:]) for m in members[1:]]
    assert shares[1].buckets <= after[0].buckets and shares[2].buckets <= after[1].buckets
    assert Share.from_json(shares[0].to_json()) == shares[0]
    assert bucket("job-1") == bucket("job-1") and 0 <= bucket("job-1") < BUCKETS


@pytest.mark.parametrize(("value", "says"), [([BUCKETS], "from 0 to"), ([1, "x"], "integer")])
def test_a_share_holds_only_buckets(value: list[object], says: str) -> None:
    with pytest.raises(InvalidError, match=says) as info:
        Share.from_json({"buckets": value})
    assert info.value.path.startswith("share.buckets")
    with pytest.raises(InvalidError, match="not among"):
        Share.of("sup-z", ("sup-a",))
