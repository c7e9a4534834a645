"""The published JSON Schema and the settings parser agree: over settings documents generated near
valid ones (every field kept, dropped, or replaced by an edge value: empty strings, enum neighbours,
bounds, wrong types), whatever the parser accepts the schema accepts. The parser refuses more — the
rules listed in docs/kubeflow-configuration.md — but never less: a host that validates with the schema
must not refuse what dispatch would run."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_kubeflow_settings import FULL

from dispatch import InvalidError
from dispatch_kubeflow import parse_settings, schema

VALIDATOR = jsonschema.Draft202012Validator(schema())

EDGES: list[Any] = [
    "", " ", "a", "A", "x" * 64, "a..b", "a-", "-a", "team-a", "/ckpt", "ckpt", "\t",
    "Exists", "Equal", "exists", "NoSchedule", "PreferNoSchedule", "NoExecute", "noexecute",
    "TrainingRuntime", "ClusterTrainingRuntime", "10s", "5s", "1h", "0s", "-1s", "1Gi", "0.5", "1e3",
    0, -1, 1, 60, 10_000, 10_001, 2**63 - 1, -(2**63), 1.5, True, False, [], {}, [{}], {"a": "b"},
]  # fmt: skip


def _near(value: Any) -> st.SearchStrategy[Any]:
    """``value`` with each part kept, dropped (in objects), replaced by an edge value, or recursed into."""
    edge = st.sampled_from(EDGES)
    if isinstance(value, dict):
        return st.fixed_dictionaries(
            {},
            optional={k: st.one_of(st.just(v), _near(v), edge) for k, v in value.items()},
        ) | st.just(value)
    if isinstance(value, list):
        items = [st.one_of(st.just(v), _near(v), edge) for v in value]
        return st.lists(st.one_of(*items), max_size=4) if items else st.just(value)
    return edge


TOLERATION_FIELDS = st.fixed_dictionaries(
    {},
    optional={
        "key": st.sampled_from(["", "a", "nvidia.com/gpu", "a b", "x" * 318]),
        "operator": st.sampled_from(["", "Exists", "Equal", "equal", "In"]),
        "value": st.sampled_from(["", "true", "a b", "x" * 64]),
        "effect": st.sampled_from(["", "NoSchedule", "PreferNoSchedule", "NoExecute", "None", "noschedule"]),
        "tolerationSeconds": st.sampled_from([0, -1, 60, 2**63 - 1, 1.5, "60"]),
    },
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.one_of(_near(FULL), st.fixed_dictionaries({"tolerations": st.lists(TOLERATION_FIELDS, max_size=3)}))
)
def test_what_the_parser_accepts_the_schema_accepts(doc: dict[str, Any]) -> None:
    try:
        parse_settings(json.dumps(doc).encode())
    except InvalidError as exc:
        assert exc.path, f"a refusal without a path: {exc}"
        return
    errors = [e.message for e in VALIDATOR.iter_errors(doc)]
    assert not errors, f"the parser accepted what the schema refuses: {errors}"


@pytest.mark.parametrize("effect", ["", "noschedule", "None"])
def test_a_toleration_effect_outside_the_schema_enum_is_refused_by_both(effect: str) -> None:
    doc = {"tolerations": [{"operator": "Exists", "effect": effect}]}
    assert list(VALIDATOR.iter_errors(doc))
    with pytest.raises(InvalidError) as info:
        parse_settings(json.dumps(doc).encode())
    assert info.value.path == "tolerations[0].effect"


def test_an_absent_effect_tolerates_every_effect() -> None:
    doc = {"tolerations": [{"operator": "Exists"}]}
    VALIDATOR.validate(doc)
    assert parse_settings(json.dumps(doc).encode()).tolerations[0].effect == ""


def test_a_lone_surrogate_in_text_settings_is_an_invalid_error_with_its_path() -> None:
    with pytest.raises(InvalidError) as info:
        parse_settings('{"namespace": "\ude29"}')  # type: ignore[arg-type]
    assert info.value.path == "namespace"
