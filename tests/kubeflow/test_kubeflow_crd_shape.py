"""The TrainJobs the adapter writes fit Trainer v2.3's TrainJob CRD field for field.

The CRD is upstream data the project must not need: the test reads it from the reference folder when it
is present (``$DISPATCH_REFERENCE_DIR`` or ``/work/shared/reference``) and skips otherwise. It checks
(1) that every field path the adapter emits exists in the CRD's openAPIV3Schema (a structural schema
prunes unknown fields silently, so a misspelt field would vanish on a real cluster), and (2) that the
object validates against that schema (types, enums, limits). kubesim's admission covers the rest in the
cluster tests.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from kubeflow_fixtures import STOCK, deepspeed_runtime, ident, jax_runtime, spec, torch_runtime

from dispatch import Image, SharedCheckpoint
from dispatch_kubeflow import RuntimeRef, parse_settings
from dispatch_kubeflow.runtime import inspect_runtime
from dispatch_kubeflow.trainjob import build_probe, build_trainjob

_CRD = Path("crds/kubeflow-trainer/trainer.kubeflow.org_trainjobs.yaml")


@functools.cache
def _schema() -> dict[str, Any] | None:
    for base in (os.environ.get("DISPATCH_REFERENCE_DIR"), "/work/shared/reference"):
        if base and (Path(base) / _CRD).is_file():
            import yaml

            doc = yaml.safe_load((Path(base) / _CRD).read_text())
            (version,) = [v for v in doc["spec"]["versions"] if v["name"] == "v1alpha1"]
            schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
            return schema
    return None


@pytest.fixture
def crd() -> dict[str, Any]:
    schema = _schema()
    if schema is None:
        pytest.skip("the Trainer v2.3 TrainJob CRD is not available (reference folder absent)")
    return schema


def _unknown_paths(value: Any, schema: dict[str, Any], path: str) -> list[str]:
    out: list[str] = []
    if isinstance(value, dict):
        if path == "metadata":  # ObjectMeta: the CRD leaves it to the API server
            return out
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties")
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            if key in props:
                out += _unknown_paths(item, props[key], sub)
            elif isinstance(extra, dict):
                out += _unknown_paths(item, extra, sub)
            elif not schema.get("x-kubernetes-preserve-unknown-fields"):
                out.append(sub)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            out += _unknown_paths(item, schema.get("items", {}), f"{path}[{i}]")
    return out


FULL_SETTINGS = parse_settings(
    json.dumps(
        {
            "namespace": "team-a",
            "queue": "q",
            "priorityClass": "high",
            "labels": {"team": "a"},
            "annotations": {"example.com/owner": "ada"},
            "serviceAccountName": "trainer",
            "nodeSelector": {"pool": "gpu"},
            "tolerations": [
                {"key": "gpu", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
            ],
            "imagePullSecrets": [{"name": "reg"}],
            "resourcesPerNode": {
                "limits": {"nvidia.com/gpu": 8, "memory": "64Gi"},
                "requests": {"cpu": "8"},
                "claims": [{"name": "gpus"}],
            },
            "checkpointVolume": {"claimName": "ckpt", "mountPath": "/ckpt"},
        }
    ).encode()
)


def _examples() -> list[dict[str, Any]]:
    full = spec(
        nodes=4,
        procs_per_node=8,
        env={"A": "1"},
        time_limit=60,
        extensions=[Image("example.org/t:1"), RuntimeRef("torch-distributed"), SharedCheckpoint("/ckpt/x")],
    )
    plain = parse_settings(b"{}")
    return [
        build_trainjob(
            full, ident("full", 3, 2), FULL_SETTINGS, inspect_runtime(torch_runtime()), kueue=True
        ),
        build_trainjob(
            spec("deepspeed-distributed"), ident(), plain, inspect_runtime(deepspeed_runtime()), held=True
        ),
        build_trainjob(spec("jax-distributed"), ident(), plain, inspect_runtime(jax_runtime())),
        *(
            build_probe("dispatch-probe-0", s, inspect_runtime(make()))
            for s in (plain, FULL_SETTINGS)
            for make in STOCK.values()
        ),
    ]


@pytest.mark.parametrize("index", range(len(_examples())))
def test_every_emitted_field_exists_in_the_crd(crd: dict[str, Any], index: int) -> None:
    obj = _examples()[index]
    assert _unknown_paths(obj, crd, "") == []


@pytest.mark.parametrize("index", range(len(_examples())))
def test_emitted_trainjobs_validate_against_the_crd(crd: dict[str, Any], index: int) -> None:
    jsonschema.Draft7Validator(crd).validate(_examples()[index])


def test_the_path_check_notices_a_misspelt_field(crd: dict[str, Any]) -> None:
    obj = _examples()[0]
    obj["spec"]["trainer"]["numNode"] = 2
    obj["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"
    ]["spec"]["template"]["spec"]["hostNetwork"] = True
    assert len(_unknown_paths(obj, crd, "")) == 2


def test_the_schema_check_notices_a_broken_limit(crd: dict[str, Any]) -> None:
    obj = _examples()[0]
    obj["spec"]["trainer"]["image"] = "x" * 501
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft7Validator(crd).validate(obj)
