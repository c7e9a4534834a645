"""Settings: strict decoding, defaults, cross-field rules, and the published JSON Schema."""

from __future__ import annotations

import json
import sys
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatch import InvalidError
from dispatch_kubeflow import KIND_TRAINING_RUNTIME, RuntimeRef, Settings, parse_settings, schema


def parse(doc: Any) -> Settings:
    return parse_settings(json.dumps(doc).encode())


FULL: dict[str, Any] = {
    "namespace": "team-a",
    "kubeconfig": "/etc/kube/config",
    "context": "prod",
    "probeRuntime": {"kind": "TrainingRuntime", "name": "torch-small"},
    "probeWindow": "1m30s",
    "probeTTL": "2h",
    "queue": "team-a-queue",
    "priorityClass": "high",
    "admissionCheck": "dispatch-hold",
    "labels": {"team": "a", "example.com/cost-centre": "42"},
    "annotations": {"example.com/owner": "Ada Lovelace <ada@example.com>"},
    "serviceAccountName": "trainer",
    "nodeSelector": {"nvidia.com/gpu.product": "H100"},
    "tolerations": [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "spot", "operator": "Equal", "value": "true", "effect": "NoExecute", "tolerationSeconds": 60},
        {"operator": "Exists"},
    ],
    "imagePullSecrets": [{"name": "registry"}],
    "resourcesPerNode": {
        "limits": {"nvidia.com/gpu": 8, "memory": "512Gi"},
        "requests": {"cpu": "32", "memory": "500Gi"},
        "claims": [{"name": "gpus"}],
    },
    "checkpointVolume": {"claimName": "ckpt", "mountPath": "/ckpt/"},
    "defaultImage": "site/python:3.11",
    "defaultRuntime": {"name": "torch-distributed"},
    "outputTailLines": 200,
}


def test_defaults_of_an_empty_object() -> None:
    s = parse({})
    assert s.namespace == "default"
    assert s.kubeconfig is None and s.context is None
    assert isinstance(s.probe_runtime, RuntimeRef)
    assert (s.probe_runtime.runtime, s.probe_runtime.kind) == ("torch-distributed", "ClusterTrainingRuntime")
    assert s.probe_window == 10.0
    assert s.probe_ttl == 3600.0
    assert s.queue is s.priority_class is s.admission_check is None
    assert dict(s.labels) == {} and dict(s.annotations) == {} and dict(s.node_selector) == {}
    assert s.tolerations == () and s.image_pull_secrets == () and s.resources_per_node is None
    assert s.checkpoint_volume is None and s.output_tail_lines == 50


def test_settings_are_frozen_values_with_a_hash() -> None:
    a, b = parse(FULL), parse(FULL)
    assert a == b and hash(a) == hash(b)  # tolerations and maps included: a frozen value is hashable
    assert a != parse({**FULL, "tolerations": []})


def test_every_key_decodes() -> None:
    s = parse(FULL)
    assert s.namespace == "team-a" and s.kubeconfig == "/etc/kube/config" and s.context == "prod"
    assert (s.probe_runtime.runtime, s.probe_runtime.kind) == ("torch-small", KIND_TRAINING_RUNTIME)
    assert s.runtime_namespace(KIND_TRAINING_RUNTIME) == "team-a"
    assert s.probe_window == 90.0
    assert s.probe_ttl == 7200.0
    assert (s.queue, s.priority_class, s.admission_check) == ("team-a-queue", "high", "dispatch-hold")
    assert s.labels["example.com/cost-centre"] == "42"
    assert s.service_account_name == "trainer"
    assert s.tolerations[2].to_json() == {"operator": "Exists"}
    assert s.tolerations[1].toleration_seconds == 60
    assert [p.name for p in s.image_pull_secrets] == ["registry"]
    assert s.resources_per_node is not None and s.resources_per_node.to_json() == FULL["resourcesPerNode"]
    assert s.checkpoint_volume is not None and s.checkpoint_volume.mount_path == "/ckpt"
    assert s.output_tail_lines == 200


@pytest.mark.parametrize(
    ("raw", "path", "words"),
    [
        (b'{"namespace": "a", "bogus": 1}', "bogus", "unknown setting"),
        (
            b'{"probeRuntime": {"kind": "ClusterTrainingRuntime", "name": "x", "extra": 1}}',
            "probeRuntime.extra",
            "unknown",
        ),
        (
            b'{"tolerations": [{"key": "a", "operator": "Exists", "color": "red"}]}',
            "tolerations[0].color",
            "unknown",
        ),
        (
            b'{"imagePullSecrets": [{"name": "a", "namespace": "b"}]}',
            "imagePullSecrets[0].namespace",
            "unknown",
        ),
        (b'{"resourcesPerNode": {"limit": {}}}', "resourcesPerNode.limit", "unknown"),
        (
            b'{"resourcesPerNode": {"claims": [{"name": "a", "x": "b"}]}}',
            "resourcesPerNode.claims[0].x",
            "unknown",
        ),
        (
            b'{"checkpointVolume": {"claimName": "c", "mountPath": "/c", "readOnly": true}}',
            "checkpointVolume.readOnly",
            "unknown",
        ),
        (b'{"namespace": "a", "namespace": "b"}', "document", "duplicate key"),
        (b'{"labels": {"a": "1", "a": "2"}}', "labels", "duplicate key"),
        (b'{"namespace": "a"} {"x": 1}', "settings", "trailing data"),
        (b'{"namespace": "a"}]', "settings", "trailing data"),
        (b'{"namespace": null}', "namespace", "null"),
        (b'{"labels": {"a": null}}', 'labels["a"]', "null"),
        (b'{"tolerations": [null]}', "tolerations[0]", "null"),
        (b'{"probeRuntime": {"kind": null, "name": "x"}}', "probeRuntime.kind", "null"),
        (b'{"resourcesPerNode": {"limits": {"cpu": null}}}', 'resourcesPerNode.limits["cpu"]', "null"),
        (b"null", "document", "null"),
        (b"[]", "document", "expected an object"),
        (b"", "settings", "not valid JSON"),
        (b"\xff\xfe", "settings", "UTF-8"),
        (b'{"outputTailLines": NaN}', "settings", "NaN"),
        (b'{"namespace": "Team_A"}', "namespace", "DNS-1123 label"),
        (b'{"namespace": 3}', "namespace", "expected a string"),
        (b'{"kubeconfig": ""}', "kubeconfig", "must not be empty"),
        (b'{"probeRuntime": {"kind": "Runtime", "name": "x"}}', "probeRuntime.kind", "unknown runtime kind"),
        (b'{"probeRuntime": {"name": "x"}}', "probeRuntime.kind", "required"),
        (b'{"probeWindow": "9s"}', "probeWindow", "at least 10s"),
        (b'{"probeWindow": "9999ms"}', "probeWindow", "at least 10s"),
        (b'{"probeWindow": "2h"}', "probeWindow", "at most 1h"),
        (b'{"probeWindow": "10"}', "probeWindow", "not a duration"),
        (b'{"probeWindow": 10}', "probeWindow", "expected a string"),
        (b'{"probeTTL": "721h"}', "probeTTL", "at most 720h"),
        (b'{"probeTTL": "1 hour"}', "probeTTL", "not a duration"),
        (b'{"probeTTL": 60}', "probeTTL", "expected a string"),
        (b'{"priorityClass": "high"}', "priorityClass", "requires queue"),
        (b'{"admissionCheck": "hold"}', "admissionCheck", "requires queue"),
        (b'{"queue": "Bad Queue"}', "queue", "Kueue object name"),
        (b'{"labels": {"dispatch.dev/job-hash": "x"}}', 'labels["dispatch.dev/job-hash"]', "dispatch's own"),
        (
            b'{"labels": {"app.kubernetes.io/managed-by": "me"}}',
            'labels["app.kubernetes.io/managed-by"]',
            "dispatch's own",
        ),
        (
            b'{"labels": {"kueue.x-k8s.io/queue-name": "q"}}',
            'labels["kueue.x-k8s.io/queue-name"]',
            "dispatch's own",
        ),
        (
            b'{"annotations": {"dispatch.dev/epoch": "1.0"}}',
            'annotations["dispatch.dev/epoch"]',
            "dispatch's own",
        ),
        (b'{"labels": {"a b": "c"}}', 'labels["a b"]', "not a valid label key"),
        (b'{"labels": {"a": "c d"}}', 'labels["a"]', "label value"),
        (b'{"labels": {"a": 1}}', 'labels["a"]', "expected a string"),
        (b'{"nodeSelector": {"zone": "' + b"x" * 64 + b'"}}', 'nodeSelector["zone"]', "at most 63"),
        (b'{"serviceAccountName": "Trainer"}', "serviceAccountName", "DNS-1123 subdomain"),
        (
            b'{"tolerations": [{"operator": "Equal", "value": "x"}]}',
            "tolerations[0].operator",
            "without a key",
        ),
        (
            b'{"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]}',
            "tolerations[0].value",
            "must not have a value",
        ),
        (
            b'{"tolerations": [{"key": "a", "effect": "NoSchedule", "tolerationSeconds": 5}]}',
            "tolerations[0].tolerationSeconds",
            "NoExecute",
        ),
        (
            b'{"tolerations": [{"key": "a", "operator": "Maybe"}]}',
            "tolerations[0].operator",
            "expected one of",
        ),
        (b'{"tolerations": [{"key": "a", "effect": "NoRun"}]}', "tolerations[0].effect", "expected one of"),
        (
            b'{"tolerations": [{"key": "a", "effect": "NoExecute", "tolerationSeconds": 9223372036854775808}]}',
            "tolerations[0].tolerationSeconds",
            "64-bit",
        ),
        (b'{"tolerations": {}}', "tolerations", "expected a list"),
        (b'{"imagePullSecrets": [{"name": "a"}, {"name": "a"}]}', "imagePullSecrets[1].name", "duplicate"),
        (b'{"imagePullSecrets": ["a"]}', "imagePullSecrets[0]", "expected an object"),
        (b'{"resourcesPerNode": {"limits": {"cpu": "lots"}}}', 'resourcesPerNode.limits["cpu"]', "quantity"),
        (b'{"resourcesPerNode": {"limits": {"cpu": -1}}}', 'resourcesPerNode.limits["cpu"]', "negative"),
        (b'{"resourcesPerNode": {"limits": {"cpu": 1.5}}}', 'resourcesPerNode.limits["cpu"]', "quantity"),
        (
            b'{"resourcesPerNode": {"limits": {"cpu": "1"}, "requests": {"cpu": "1500m"}}}',
            'resourcesPerNode.requests["cpu"]',
            "above the limit",
        ),
        (
            b'{"resourcesPerNode": {"claims": [{"name": "a"}, {"name": "a"}]}}',
            "resourcesPerNode.claims[1].name",
            "duplicate",
        ),
        (b'{"checkpointVolume": {"claimName": "c"}}', "checkpointVolume.mountPath", "required"),
        (
            b'{"checkpointVolume": {"claimName": "c", "mountPath": "ckpt"}}',
            "checkpointVolume.mountPath",
            "absolute",
        ),
        (b'{"checkpointVolume": {"claimName": "c", "mountPath": "/"}}', "checkpointVolume.mountPath", "root"),
        (
            b'{"checkpointVolume": {"claimName": "c", "mountPath": "/a/../b"}}',
            "checkpointVolume.mountPath",
            "'..'",
        ),
        (b'{"outputTailLines": -1}', "outputTailLines", "between 0 and"),
        (b'{"outputTailLines": "50"}', "outputTailLines", "expected an integer"),
        (b'{"outputTailLines": true}', "outputTailLines", "expected an integer"),
    ],
)
def test_strict_refusals_name_the_path(raw: bytes, path: str, words: str) -> None:
    with pytest.raises(InvalidError) as info:
        parse_settings(raw)
    assert info.value.path == path, str(info.value)
    assert words in str(info.value)


def test_deep_nesting_is_an_invalid_error() -> None:
    with pytest.raises(InvalidError):
        parse_settings(b'{"labels": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")


def test_str_input_is_accepted_and_other_types_refused() -> None:
    assert parse_settings('{"namespace": "x"}').namespace == "x"  # type: ignore[arg-type]
    with pytest.raises(InvalidError):
        parse_settings({"namespace": "x"})  # type: ignore[arg-type]


# --- the schema --------------------------------------------------------------------------------------


def test_schema_is_valid_draft_2020_12() -> None:
    doc = schema()
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(doc)


# That every object of the schema is closed is checked for every adapter's printed schema, in
# tests/host/test_model_declared_once.py.


def test_schema_lists_every_key_the_parser_reads() -> None:
    assert set(schema()["properties"]) == set(FULL)
    parse(FULL)
    jsonschema.Draft202012Validator(schema()).validate(FULL)


@pytest.mark.parametrize(
    "doc",
    [
        {"probeWindow": "5s"},
        {"priorityClass": "high"},
        {"admissionCheck": "hold"},
        {"labels": {"dispatch.dev/job-hash": "x"}},
        {"tolerations": [{"key": "a", "operator": "Exists", "value": "x"}]},
        {"tolerations": [{"operator": "Equal"}]},
        {"resourcesPerNode": {"limits": {"cpu": "1"}, "requests": {"cpu": "2"}}},
        {"checkpointVolume": {"claimName": "c", "mountPath": "/"}},
        {"queue": "a..b"},
        {"queue": "q", "priorityClass": "a.-b"},
        {"labels": {"a" * 64: "x"}},
        {"nodeSelector": {"example.com/" + "n" * 64: "x"}},
        {"tolerations": [{"key": "a b", "operator": "Exists"}]},
    ],
)
def test_what_the_schema_accepts_but_the_parser_refuses(doc: dict[str, Any]) -> None:
    """The documented list (docs/kubeflow-configuration.md): shapes are fine, rules are broken."""
    jsonschema.Draft202012Validator(schema()).validate(doc)
    with pytest.raises(InvalidError):
        parse(doc)


# --- properties --------------------------------------------------------------------------------------

_keys = st.sampled_from([*FULL, "bogus", "name", "kind", "key", "limits", "claimName", "mountPath"])
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    # Beyond int64, and beyond Python's 4,300-digit limit on int(): both must be InvalidError.
    st.integers(2**62, 2**70).map(lambda n: n * (1 if n % 2 else -1)),
    st.sampled_from([4400, 5000]).map(lambda n: -(10**n) if n == 5000 else 10**n),
    st.floats(allow_nan=False),
    st.text(max_size=12),
    st.sampled_from(
        ["10s", "1m", "Exists", "NoExecute", "torch-distributed", "ClusterTrainingRuntime", "/ckpt", "4Gi"]
    ),
)
_json = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.one_of(_keys, st.text(max_size=8)), inner, max_size=5)
    ),
    max_leaves=20,
)


def _mutations() -> st.SearchStrategy[dict[str, Any]]:
    """Documents close to valid ones: a valid base with one key replaced by an arbitrary value."""
    return st.builds(
        lambda key, value: {**FULL, key: value},
        st.sampled_from(list(FULL)),
        _json,
    )


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_no_bytes_raise_anything_but_invalid_error(raw: bytes) -> None:
    try:
        parse_settings(raw)
    except InvalidError:
        pass


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(_json, _mutations(), st.dictionaries(_keys, _json, max_size=6)))
def test_no_document_raises_anything_but_invalid_error_and_accepted_ones_fit_the_schema(doc: Any) -> None:
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)  # only to write the document: the decoder must cope at the default
    try:
        text = json.dumps(doc)
    finally:
        sys.set_int_max_str_digits(limit)
    try:
        parsed = parse_settings(text.encode())
    except InvalidError as exc:
        assert str(exc)
        return
    assert isinstance(parsed, Settings)
    jsonschema.Draft202012Validator(schema()).validate(doc)


@settings(max_examples=200)
@given(
    st.one_of(
        st.text(max_size=60),
        # Whitespace JSON does not allow, surrogate escapes, and nesting past the limit.
        st.sampled_from(["\x0b{}", "{}\xa0", '{"namespace": "\\ud800"}', "[" * 150 + "]" * 150]),
    )
)
def test_any_text_is_settings_or_invalid(text: str) -> None:
    try:
        parse_settings(text.encode("utf-8", "surrogatepass"))
    except InvalidError:
        pass
