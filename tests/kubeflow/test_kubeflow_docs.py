"""The concrete TrainJobs shown in docs/kubeflow-trainjob.md are exactly what the adapter writes, and the
configuration reference names every settings key."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubeflow_fixtures import ident, spec, torch_runtime

from dispatch import Image, SharedCheckpoint
from dispatch_kubeflow import RuntimeRef, parse_settings, schema
from dispatch_kubeflow.runtime import inspect_runtime
from dispatch_kubeflow.trainjob import build_probe, build_trainjob

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _examples() -> dict[str, Any]:
    text = (DOCS / "kubeflow-trainjob.md").read_text()
    blocks = re.findall(r"<!-- example: (\w+) -->\n```yaml\n(.*?)```", text, re.S)
    return {name: yaml.safe_load(body) for name, body in blocks}


def test_the_documented_trainjobs_are_what_the_adapter_writes() -> None:
    examples = _examples()
    assert set(examples) == {"job", "full", "held", "probe"}
    settings = parse_settings(
        json.dumps(
            {
                "namespace": "team-a",
                "queue": "team-a",
                "labels": {"team": "vision"},
                "serviceAccountName": "trainer",
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": 8}},
                "checkpointVolume": {"claimName": "checkpoints", "mountPath": "/ckpt"},
            }
        ).encode()
    )
    job = spec(
        command=("torchrun", "train.py", "--epochs", "10"),
        nodes=4,
        procs_per_node=8,
        env={"WANDB_PROJECT": "resnet"},
        time_limit=86400,
        extensions=[
            Image("ghcr.io/acme/resnet:1.4"),
            RuntimeRef("torch-distributed"),
            SharedCheckpoint("/ckpt/resnet-50"),
        ],
    )
    from dispatch import JobSpec

    assert JobSpec.from_json(examples["job"]) == job
    info = inspect_runtime(torch_runtime())
    assert examples["full"] == build_trainjob(job, ident("resnet-50", 3, 1), settings, info, kueue=True)
    empty = parse_settings(b"{}")
    held = build_trainjob(spec(command=("python", "train.py")), ident("Exp_42.b"), empty, info, held=True)
    assert examples["held"] == held
    # Under Kueue the same held job carries the annotation but no suspend: Kueue owns it.
    queued = parse_settings(b'{"queue": "q", "admissionCheck": "dispatch-hold"}')
    held_q = build_trainjob(
        spec(command=("python", "train.py")), ident("Exp_42.b"), queued, info, held=True, kueue=True
    )
    assert "suspend" not in held_q["spec"]
    assert held_q["metadata"]["annotations"] == held["metadata"]["annotations"]
    assert examples["probe"] == build_probe("dispatch-probe-3f9a1c2e", empty, info)


@pytest.mark.parametrize("key", sorted(schema()["properties"]))
def test_the_configuration_reference_documents_every_key(key: str) -> None:
    assert f"| `{key}` |" in (DOCS / "kubeflow-configuration.md").read_text()
