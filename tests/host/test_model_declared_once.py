"""Each model type is declared once; decoding, encoding and the schemas are derived from it.

The codec has two paths over the one declaration (``dispatch.model._base``): msgspec's, which decodes,
and the strict walk, which explains a refusal. These tests hold them to each other, hold the published
schemas to the parsers, and keep hand-written codecs out of the model.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dispatch
from dispatch import InvalidError, JobRecord, JobSpec, Outcome, Policy, Transition
from dispatch.cli.clusters import adapter_schema
from dispatch.cli.commands import cli
from dispatch.model import _base
from dispatch.registry import load_installed

SRC = Path(dispatch.__file__).resolve().parent.parent

# --- the published schemas -----------------------------------------------------------------------------


def _objects(node: Any, path: str = "#") -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        if node.get("type") == "object":
            found.append((path, node))
        for key, value in node.items():
            found += _objects(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _objects(value, f"{path}/{i}")
    return found


@pytest.mark.parametrize("adapter", [a.name for a in load_installed() if a.schema is not None])
def test_every_printed_schema_is_2020_12_and_closed_at_every_level(
    adapter: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DISPATCH_STATE_DIR", str(tmp_path))
    result = CliRunner().invoke(cli, ["schema", adapter], catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc == adapter_schema(adapter)
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(doc)
    objects = _objects(doc)
    assert len(objects) >= (
        10 if adapter == "kubeflow" else 1
    )  # kubeflow: settings, probe runtime, maps, ...
    for path, node in objects:
        extra = node.get("additionalProperties")
        if "properties" in node:
            assert extra is False, path  # an object with fixed keys is closed
        else:
            assert isinstance(extra, dict) and extra, path  # a map says what its values are
    assert "null" not in json.dumps(doc), "the decoders refuse null: no schema may allow it"


def test_the_cluster_config_schema_is_closed_and_every_example_config_fits_it() -> None:
    from dispatch.cli.config import DEFAULT_CONFIG, MEMORY_DEFAULT, schema
    from dispatch.model import load_yaml

    doc = schema()
    jsonschema.Draft202012Validator.check_schema(doc)
    for path, node in _objects(doc):
        if "properties" in node:
            assert node.get("additionalProperties") is False, path
    examples = [p for p in (SRC.parent / "examples").glob("*-cluster.yaml")]
    assert examples
    for text in [DEFAULT_CONFIG, MEMORY_DEFAULT, *(p.read_text() for p in examples)]:
        jsonschema.Draft202012Validator(doc).validate(load_yaml(text))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(doc).validate({"adaptor": "memory"})


# --- the two paths of the codec agree ----------------------------------------------------------------

_keys = st.sampled_from(
    [
        "command", "nodes", "procsPerNode", "env", "timeLimit", "extensions", "dispatch/Image", "ref",
        "acme/Thing", "state", "cause", "evidence", "kind", "name", "exitCode", "output", "rules",
        "default", "action", "max", "backoff", "backoffCap", "preempted", "HOME", "A B", "at", "actor",
        "what", "epoch",
    ]
)  # fmt: skip
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-3, 2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(
        ["x", "", "fail", "requeue", "failed", "out_of_memory", "1.0", "2.1", "/ckpt", "null", "user"]
    ),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_keys, inner, max_size=5),
    max_leaves=25,
)
_VALID = {
    JobSpec: {"command": ["python", "train.py"], "nodes": 2, "env": {"A": "1"}},
    Outcome: {"state": "failed", "cause": "out_of_memory", "evidence": [{"kind": "Pod", "name": "p"}]},
    Policy: {"rules": {"preempted": {"action": "requeue", "max": 5}, "evicted": "fail"}, "default": "hold"},
    Transition: {"at": 1.5, "actor": "user", "what": "submitted", "epoch": "2.1"},
}


def _near(cls: type) -> st.SearchStrategy[Any]:
    """Documents close to a valid one of ``cls``: one key replaced or added, with any JSON value."""
    base = _VALID[cls]
    return st.one_of(
        _json,
        st.builds(lambda k, v: {**base, k: v}, st.one_of(st.sampled_from(list(base)), _keys), _json),
    )


def _outcome(fn: Any) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except InvalidError as exc:
        return "refused", exc.path


@pytest.mark.parametrize("cls", list(_VALID), ids=lambda c: c.__name__)
@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_fast_path_accepts_exactly_what_the_strict_walk_accepts(cls: type, data: st.DataObject) -> None:
    doc = data.draw(_near(cls))
    fast = _outcome(lambda: cls.from_json(doc, ""))  # type: ignore[attr-defined]
    strict = _outcome(lambda: _base._explain(_base._type_info(cls), doc, ""))
    assert fast == strict


@pytest.mark.parametrize(
    ("cls", "doc", "path"),
    [
        (Transition, {"at": 2**63, "actor": "user", "what": "x"}, "at"),
        (
            Outcome,
            {"state": "failed", "evidence": [{"kind": "P", "name": "p", "exitCode": 2**63}]},
            "evidence[0].exitCode",
        ),
        (
            Outcome,
            {"state": "failed", "evidence": [{"kind": "P", "name": "p", "at": float("inf")}]},
            "evidence[0].at",
        ),
        (JobSpec, {"command": ["x"], "timeLimit": None}, "timeLimit"),
    ],
)
def test_what_msgspec_would_let_through_is_refused(cls: type, doc: Any, path: str) -> None:
    """Beyond int64 (msgspec takes up to 2**64), non-finite numbers and null take the strict walk."""
    with pytest.raises(InvalidError) as info:
        cls.from_json(doc, "")  # type: ignore[attr-defined]
    assert info.value.path == path


def test_valid_documents_decode_on_both_paths_to_the_same_value() -> None:
    for cls, doc in _VALID.items():
        value = cls.from_json(doc)  # type: ignore[attr-defined]
        assert value == _base._explain(_base._type_info(cls), doc, "")
        assert cls.from_json(value.to_json()) == value  # type: ignore[attr-defined]


def test_a_stored_record_reads_back_through_the_one_pass_decoder() -> None:
    from dispatch.records._common import checked_record, decode_record, record_text

    rec = JobRecord(job_id="j", spec=JobSpec.from_json(_VALID[JobSpec]), created_at=1.0, updated_at=2.0)
    rec = rec.replace(outcome=Outcome.from_json(_VALID[Outcome]), policy=Policy.from_json(_VALID[Policy]))
    assert checked_record(rec) == rec
    assert decode_record("j", record_text(rec), "test") == rec


# --- no hand-written codec in the model ---------------------------------------------------------------

_DECLARED = [
    "dispatch/model/spec.py",
    "dispatch/model/outcome.py",
    "dispatch/model/policy.py",
    "dispatch/model/record.py",
    "dispatch/model/identity.py",
    "dispatch/model/observation.py",
    "dispatch/model/capabilities.py",
    "dispatch/model/extensions.py",
    "dispatch/model/share.py",
    "dispatch/memory/settings.py",
    "dispatch_kubeflow/settings.py",
    "dispatch_kubeflow/extension.py",
    "dispatch/cli/config.py",
]


@pytest.mark.parametrize("module", _DECLARED)
def test_model_types_do_not_write_their_codec_by_hand(module: str) -> None:
    """A Model subclass gets to_json, from_json and its schema from its fields; writing them again
    is the duplication the declaration removed."""
    tree = ast.parse((SRC / module).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and any(
            isinstance(b, ast.Name) and b.id in {"Model", "RuntimeRef"} for b in node.bases
        ):
            methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
            assert not methods & {"to_json", "from_json", "schema"}, f"{module}: {node.name}"


@pytest.mark.parametrize(
    ("text", "path"),
    [
        ('"policy":null', "policy"),
        ('"revision":9223372036854775808', "revision"),
        ('"revision":1,"revision":2', "document"),
    ],
)
def test_a_stored_record_is_read_as_strictly_as_a_document(text: str, path: str) -> None:
    """The stores' one-pass decoder hands what msgspec would let through to the strict readers."""
    from dispatch.model._base import decode_text
    from dispatch.records._common import record_text

    rec = JobRecord(job_id="j", spec=JobSpec(("x",)), created_at=1.0, updated_at=2.0, revision=5)
    assert '"revision":5' in record_text(rec)
    stored = record_text(rec).replace('"revision":5', text)
    with pytest.raises(InvalidError) as info:
        decode_text(JobRecord, stored, "record", max_depth=110)
    assert info.value.path == path, str(info.value)
