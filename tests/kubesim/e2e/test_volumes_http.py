"""PersistentVolumeClaims over real HTTP (kubectl: core/test_kubectl_storage.py): the default StorageClass binds a claim at
once, ``WaitForFirstConsumer`` waits for a pod, the scheduler refuses a pod whose claim is missing or
unbound, a pod on a node whose claim is missing waits ``ContainerCreating`` with ``FailedMount``, and a
deleted claim takes its volume with it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubesim import Simulator

from .conftest import call

NS = "default"
PVCS = f"/api/v1/namespaces/{NS}/persistentvolumeclaims"
PODS = f"/api/v1/namespaces/{NS}/pods"


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    async with Simulator() as s:
        yield s


def claim(name: str, storage_class: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "5Gi"}}}
    if storage_class is not None:
        spec["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }


def pod(name: str, claim_name: str, node: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "node",
                "image": "registry.example.com/x:1",
                "env": [{"name": "KUBESIM_SCRIPT", "value": "hang"}],
            }
        ],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim_name}}],
    }
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec}


async def events_of(sim: Simulator, name: str) -> list[tuple[str, str]]:
    code, body = await call(
        sim, "GET", f"/api/v1/namespaces/{NS}/events", fieldSelector=f"involvedObject.name={name}"
    )
    assert code == 200, body
    return [(e["reason"], e["message"]) for e in body["items"]]


async def test_the_default_class_binds_a_claim_at_once(sim: Simulator) -> None:
    code, body = await call(sim, "POST", PVCS, claim("ckpt"))
    assert code == 201, body
    assert body["spec"]["storageClassName"] == "standard"  # the DefaultStorageClass admission plugin
    assert body["status"]["phase"] == "Pending" and body["spec"]["volumeMode"] == "Filesystem"
    await sim.settle()
    code, pvc = await call(sim, "GET", f"{PVCS}/ckpt")
    assert pvc["status"] == {
        "phase": "Bound",
        "accessModes": ["ReadWriteOnce"],
        "capacity": {"storage": "5Gi"},
    }
    volume = pvc["spec"]["volumeName"]
    assert volume == f"pvc-{pvc['metadata']['uid']}"
    assert pvc["metadata"]["annotations"]["pv.kubernetes.io/bind-completed"] == "yes"
    code, pv = await call(sim, "GET", f"/api/v1/persistentvolumes/{volume}")
    assert (pv["status"]["phase"], pv["spec"]["claimRef"]["name"], pv["spec"]["storageClassName"]) == (
        "Bound",
        "ckpt",
        "standard",
    )
    assert [r for r, _ in await events_of(sim, "ckpt")] == [
        "ExternalProvisioning",
        "Provisioning",
        "ProvisioningSucceeded",
    ]
    # A pod using it runs; deleting the claim (after the pod) deletes the volume (reclaim policy Delete).
    code, body = await call(sim, "POST", PODS, pod("user", "ckpt"))
    assert code == 201, body
    await sim.settle()
    code, body = await call(sim, "GET", f"{PODS}/user")
    assert body["status"]["phase"] == "Running"
    code, body = await call(sim, "DELETE", f"{PVCS}/ckpt")
    assert code == 200, body
    await sim.settle()
    code, _ = await call(sim, "GET", f"/api/v1/persistentvolumes/{volume}")
    assert code == 404


async def test_wait_for_first_consumer_binds_where_the_pod_goes(sim: Simulator) -> None:
    code, body = await call(sim, "POST", PVCS, claim("local", "wait-for-consumer"))
    assert code == 201, body
    await sim.settle()
    code, pvc = await call(sim, "GET", f"{PVCS}/local")
    assert pvc["status"]["phase"] == "Pending"
    assert (
        "WaitForFirstConsumer",
        "waiting for first consumer to be created before binding",
    ) in await events_of(sim, "local")
    code, body = await call(sim, "POST", PODS, pod("consumer", "local"))
    assert code == 201, body
    await sim.settle()
    code, p = await call(sim, "GET", f"{PODS}/consumer")
    code, pvc = await call(sim, "GET", f"{PVCS}/local")
    assert pvc["status"]["phase"] == "Bound"
    assert pvc["metadata"]["annotations"]["volume.kubernetes.io/selected-node"] == p["spec"]["nodeName"]
    assert p["status"]["phase"] == "Running"
    code, pv = await call(sim, "GET", f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}")
    terms = pv["spec"]["nodeAffinity"]["required"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0]["values"] == [p["spec"]["nodeName"]]


async def test_a_missing_or_unbound_claim_keeps_the_pod_from_running(sim: Simulator) -> None:
    # The scheduler refuses a pod whose claim does not exist ...
    code, body = await call(sim, "POST", PODS, pod("orphan", "nope"))
    assert code == 201, body
    await sim.settle()
    code, p = await call(sim, "GET", f"{PODS}/orphan")
    (scheduled,) = [c for c in p["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled["message"] == (
        '0/4 nodes are available: persistentvolumeclaim "nope" not found. preemption: 0/4 nodes are '
        "available: 4 Preemption is not helpful for scheduling."
    )
    # ... and one whose Immediate claim is not bound (its class does not exist).
    code, body = await call(sim, "POST", PVCS, claim("stuck", "no-such-class"))
    assert code == 201, body
    code, body = await call(sim, "POST", PODS, pod("waits", "stuck"))
    await sim.settle()
    code, p = await call(sim, "GET", f"{PODS}/waits")
    assert "pod has unbound immediate PersistentVolumeClaims" in p["status"]["conditions"][0]["message"]
    assert ("ProvisioningFailed", 'storageclass.storage.k8s.io "no-such-class" not found') in await events_of(
        sim, "stuck"
    )
    # A pod already on a node (nodeName set) whose claim is missing waits ContainerCreating.
    code, body = await call(sim, "POST", PODS, pod("placed", "later", node="node-0"))
    assert code == 201, body
    await sim.settle()
    code, p = await call(sim, "GET", f"{PODS}/placed")
    assert p["status"]["phase"] == "Pending"
    assert p["status"]["containerStatuses"][0]["state"] == {"waiting": {"reason": "ContainerCreating"}}
    (failed,) = [m for r, m in await events_of(sim, "placed") if r == "FailedMount"]
    assert failed == (
        "Unable to attach or mount volumes: unmounted volumes=[data], unattached volumes=[data], failed to "
        "process volumes=[data]: error processing PVC default/later: failed to fetch PVC from API server: "
        'persistentvolumeclaims "later" not found'
    )
    # Once the claim exists (and binds), the kubelet's next try mounts it and the container starts.
    code, body = await call(sim, "POST", PVCS, claim("later"))
    assert code == 201, body
    sim.advance(10)
    code, p = await call(sim, "GET", f"{PODS}/placed")
    assert p["status"]["phase"] == "Running"
