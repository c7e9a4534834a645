"""Wrongly typed TrainJob and JobSet bodies are refused over HTTP, never a 500, and nothing malformed
reaches the controllers: 422 field causes from a CRD schema, 400 from a webhook that decodes the object
into its Go type first (Trainer's TrainJob defaulter)."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from kubesim.resources import PODS
from kubesim.sim import Simulator

from .helpers import no_controller_errors, trainjob

TRAINJOBS_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"
JOBSETS_PATH = "/apis/jobset.x-k8s.io/v1alpha2/namespaces/default/jobsets"


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    async with Simulator() as s:  # Kueue on: its defaulter runs before the schema, too
        yield s


async def post(sim: Simulator, path: str, body: dict[str, Any], query: str = "") -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {sim.token('admin')}", "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(sim.url + path + query, data=json.dumps(body), headers=headers) as resp,
    ):
        return resp.status, await resp.json()


def with_value(body: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(body)
    cur: Any = out
    for key in path[:-1]:
        cur = cur[key]
    cur[path[-1]] = value
    return out


def patched_trainjob() -> dict[str, Any]:
    body = trainjob("typed", env={"A": "b"})
    body["spec"]["runtimePatches"] = [
        {
            "manager": "example.com/m",
            "trainingRuntimeSpec": {
                "template": {
                    "spec": {
                        "replicatedJobs": [
                            {
                                "name": "node",
                                "template": {"spec": {"template": {"spec": {"nodeSelector": {}}}}},
                            }
                        ]
                    }
                }
            },
        }
    ]
    return body


RJOB_POD = ("spec", "runtimePatches", 0, "trainingRuntimeSpec", "template", "spec", "replicatedJobs", 0)


@pytest.mark.parametrize(
    ("path", "value", "field", "got", "want"),
    [
        (("spec",), "s", "spec", "string", "object"),
        (("spec", "runtimePatches"), 5, "spec.runtimePatches", "integer", "array"),
        (("spec", "runtimePatches", 0, "manager"), [], "spec.runtimePatches[0].manager", "array", "string"),
        (
            ("spec", "runtimePatches", 0, "trainingRuntimeSpec"),
            "s",
            "spec.runtimePatches[0].trainingRuntimeSpec",
            "string",
            "object",
        ),
        (
            (*RJOB_POD, "template", "spec", "template", "spec", "nodeSelector"),
            "s",
            "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0].template.spec.template"
            ".spec.nodeSelector",
            "string",
            "object",
        ),
        (
            (*RJOB_POD[:-1],),
            [None],
            "spec.runtimePatches[0].trainingRuntimeSpec.template.spec.replicatedJobs[0]",
            "null",
            "object",
        ),
        (("spec", "trainer", "env", 0, "name"), {"a": 1}, "spec.trainer.env[0].name", "object", "string"),
    ],
)
async def test_wrong_types_in_a_trainjob_are_refused(
    sim: Simulator, path: tuple[Any, ...], value: Any, field: str, got: str, want: str
) -> None:
    body = with_value(patched_trainjob(), path, value)
    schema_cause = {
        "reason": "FieldValueTypeInvalid",
        "message": f'Invalid value: "{got}": {field} in body must be of type {want}: "{got}"',
        "field": field,
    }
    for query in ("?dryRun=All", ""):
        status, answer = await post(sim, TRAINJOBS_PATH, body, query)
        if got == "null":  # Go decodes a null item into a zero value: the CRD schema refuses it
            assert status == 422 and answer["reason"] == "Invalid", answer
            assert schema_cause in answer["details"]["causes"]
        else:  # Trainer's defaulting webhook runs before the schema and cannot decode the object
            assert status == 400, answer
            assert answer["message"].startswith(
                'admission webhook "defaulter.trainjob.trainer.kubeflow.org" denied the request: '
                "json: cannot unmarshal "
            )
            go_field = re.sub(r"\[\d+\]", "", field)  # Go names the field without list indexes
            assert f"into Go struct field TrainJob.{go_field} of type" in answer["message"]
    await sim.settle()
    no_controller_errors(sim)
    async with Simulator(controllers=[]) as bare:  # no webhooks installed: the CRD schema answers
        status, answer = await post(bare, TRAINJOBS_PATH, body)
        assert status == 422 and schema_cause in answer["details"]["causes"], answer


async def test_malformed_labels_on_a_queued_trainjob_are_422_not_500(sim: Simulator) -> None:
    body = trainjob("typed")
    body["metadata"]["labels"] = "kueue.x-k8s.io/queue-name=user-queue"
    status, answer = await post(sim, TRAINJOBS_PATH, body)
    assert status == 422, answer
    assert answer["details"]["causes"][0]["field"] == "metadata.labels"


def jobset() -> dict[str, Any]:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "js", "namespace": "default"},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "w",
                    "template": {
                        "spec": {
                            "template": {
                                "spec": {
                                    "restartPolicy": "Never",
                                    "containers": [{"name": "node", "image": "busybox", "env": []}],
                                }
                            }
                        }
                    },
                }
            ]
        },
    }


@pytest.mark.parametrize(
    ("path", "value", "field", "got", "want"),
    [
        (("spec", "replicatedJobs"), "x", "spec.replicatedJobs", "string", "array"),
        (
            ("spec", "replicatedJobs", 0, "template"),
            "s",
            "spec.replicatedJobs[0].template",
            "string",
            "object",
        ),
        (("spec", "network"), True, "spec.network", "boolean", "object"),
        (
            ("spec", "replicatedJobs", 0, "template", "spec", "template", "spec", "containers", 0, "env"),
            "s",
            "spec.replicatedJobs[0].template.spec.template.spec.containers[0].env",
            "string",
            "array",
        ),
    ],
)
async def test_wrong_types_in_a_jobset_are_422(
    sim: Simulator, path: tuple[Any, ...], value: Any, field: str, got: str, want: str
) -> None:
    status, answer = await post(sim, JOBSETS_PATH, with_value(jobset(), path, value))
    assert status == 422, answer
    assert answer["details"]["causes"] == [
        {
            "reason": "FieldValueTypeInvalid",
            "message": f'Invalid value: "{got}": {field} in body must be of type {want}: "{got}"',
            "field": field,
        }
    ]
    await sim.settle()
    no_controller_errors(sim)


async def test_null_jobset_fields_are_dropped_and_defaulted(sim: Simulator) -> None:
    body = with_value(jobset(), ("spec", "network"), None)
    body["spec"]["replicatedJobs"][0]["replicas"] = None
    status, answer = await post(sim, JOBSETS_PATH, body)
    assert status == 201, answer
    assert answer["spec"]["replicatedJobs"][0]["replicas"] == 1
    assert answer["spec"]["network"]["enableDNSHostnames"] is True
    await sim.settle()
    no_controller_errors(sim)


async def test_jobset_without_replicated_job_name_is_422(sim: Simulator) -> None:
    body = jobset()
    body["spec"]["replicatedJobs"][0]["name"] = None
    status, answer = await post(sim, JOBSETS_PATH, body)
    assert status == 422, answer
    assert answer["details"]["causes"][0]["field"] == "spec.replicatedJobs[0].name"


async def test_nulls_in_a_runtime_patch_are_pruned_not_merged_as_deletions(sim: Simulator) -> None:
    body = with_value(patched_trainjob(), (*RJOB_POD, "template", "spec", "template", "spec"), None)
    status, answer = await post(sim, TRAINJOBS_PATH, body)
    assert status == 201, answer
    await sim.settle()
    no_controller_errors(sim)
    pods = sim.store.list(PODS, "default", label_selector="jobset.sigs.k8s.io/jobset-name=typed")[0]
    assert [c["name"] for p in pods for c in p["spec"]["containers"]] == ["node"]
