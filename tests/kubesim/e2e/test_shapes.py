"""Wrongly typed fields that kubesim's controllers read are 422 over HTTP, so a single malformed object
can neither crash a request nor stall a controller for everyone else."""

from __future__ import annotations

import json
from typing import Any

import aiohttp

from kubesim import Simulator
from kubesim.resources import EVENTS, PODS, TRAINJOBS

WORKLOADS_PATH = "/apis/kueue.x-k8s.io/v1beta2/namespaces/default/workloads"
PODS_PATH = "/api/v1/namespaces/default/pods"


async def post(sim: Simulator, path: str, body: Any) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {sim.token('admin')}", "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(sim.url + path, data=json.dumps(body), headers=headers) as resp,
    ):
        return resp.status, await resp.json()


def workload(name: str, **spec: Any) -> dict[str, Any]:
    pod_set = {
        "name": "main",
        "count": 1,
        "template": {"spec": {"containers": [{"name": "c", "image": "x"}]}},
    }
    return {
        "apiVersion": "kueue.x-k8s.io/v1beta2",
        "kind": "Workload",
        "metadata": {"name": name},
        "spec": {"queueName": "user-queue", "podSets": [pod_set], **spec},
    }


def queued_trainjob(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"kueue.x-k8s.io/queue-name": "user-queue"},
        },
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 1}},
    }


async def test_a_mistyped_workload_is_422_and_kueue_keeps_admitting(sim: Simulator) -> None:
    status, body = await post(sim, WORKLOADS_PATH, workload("bad", priority="high"))
    assert status == 422, body
    assert body["details"]["causes"] == [
        {
            "reason": "FieldValueTypeInvalid",
            "message": 'Invalid value: "string": spec.priority in body must be of type integer: "string"',
            "field": "spec.priority",
        }
    ]
    status, body = await post(
        sim, "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs", queued_trainjob("q")
    )
    assert status == 201, body
    await sim.settle()
    assert sim.store.get(TRAINJOBS, "default", "q")["spec"]["suspend"] is False  # admitted
    assert [e for c in sim.controllers for e in getattr(c, "errors", [])] == []


async def test_a_workload_with_a_null_pod_set_count_counts_one(sim: Simulator) -> None:
    body = workload("nullcount")
    body["spec"]["podSets"][0]["count"] = None
    status, answer = await post(sim, WORKLOADS_PATH, body)
    assert status == 201, answer
    await sim.settle()
    assert [e for c in sim.controllers for e in getattr(c, "errors", [])] == []


async def test_mistyped_or_empty_pod_specs_are_422(sim: Simulator) -> None:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {"containers": 5},
    }
    status, body = await post(sim, PODS_PATH, pod)
    assert status == 422, body
    assert body["details"]["causes"][0]["field"] == "spec.containers"
    pod["spec"] = {"containers": [{"name": "c", "image": "x", "resources": {"requests": 5}}]}
    status, body = await post(sim, PODS_PATH, pod)
    assert status == 422, body
    assert body["details"]["causes"][0]["field"] == "spec.containers[0].resources.requests"
    pod["spec"] = None
    status, body = await post(sim, PODS_PATH, pod)
    assert status == 422, body
    assert body["details"]["causes"] == [
        {"reason": "FieldValueRequired", "message": "Required value", "field": "spec.containers"}
    ]
    await sim.settle()
    assert [e for c in sim.controllers for e in getattr(c, "errors", [])] == []


async def test_a_mistyped_access_review_is_400_not_500(sim: Simulator) -> None:
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": "pods"},
    }
    status, body = await post(sim, "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", review)
    assert status == 400, body
    assert "spec.resourceAttributes" in body["message"]


async def test_an_indexed_job_too_wide_is_422_and_a_huge_trainjob_creates_no_pods(sim: Simulator) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "wide"},
        "spec": {
            "completionMode": "Indexed",
            "completions": 10**30,
            "parallelism": 10**30,
            "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "x"}]}},
        },
    }
    status, body = await post(sim, "/apis/batch/v1/namespaces/default/jobs", job)
    assert status == 422, body
    assert body["details"]["causes"][0]["field"] == "spec.parallelism"
    assert "must be less than or equal to 100000 when completion mode is Indexed" in body["message"]

    tj = queued_trainjob("huge")
    del tj["metadata"]["labels"]
    tj["spec"]["trainer"]["numNodes"] = 10**30  # once exhausted the simulator's memory
    status, body = await post(sim, "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs", tj)
    assert status == 201, body
    await sim.settle()
    events = sim.store.list(
        EVENTS, "default", field_selector="involvedObject.name=huge,reason=JobCreationFailed"
    )[0]
    assert events, "the JobSet controller reports the refused Job"
    assert all(e["type"] == "Warning" and "spec.parallelism" in e["message"] for e in events)
    assert sim.store.list(PODS, "default", label_selector="jobset.sigs.k8s.io/jobset-name=huge")[0] == []
    assert [e for c in sim.controllers for e in getattr(c, "errors", [])] == []


async def test_the_trainjob_crd_is_served_with_its_schema(sim: Simulator) -> None:
    """A client can read the TrainJob CRD from apiextensions to see which spec fields this Trainer has."""
    headers = {"Authorization": f"Bearer {sim.token('readonly')}"}
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/trainjobs.trainer.kubeflow.org"
    async with aiohttp.ClientSession() as session, session.get(sim.url + path, headers=headers) as resp:
        assert resp.status == 200
        crd = await resp.json()
    (version,) = crd["spec"]["versions"]
    assert version["name"] == "v1alpha1"
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert {"runtimeRef", "trainer", "suspend", "activeDeadlineSeconds", "runtimePatches"} <= set(spec)
    assert "numProcPerNode" in spec["trainer"]["properties"]


def test_an_older_trainer_crd_lacks_the_fields_named() -> None:
    from kubesim.crds import trainjob_crd

    crd = trainjob_crd(without=("runtimePatches", "trainer.numProcPerNode"))
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert "runtimePatches" not in spec and "numProcPerNode" not in spec["trainer"]["properties"]
    assert "activeDeadlineSeconds" in spec
