"""Deletion over real HTTP: finalizers, propagation policies, garbage collection, graceful pods."""

from __future__ import annotations

from typing import Any

from lightkube import AsyncClient
from lightkube.types import CascadeType

from kubesim import Simulator
from kubesim.resources import CONFIGMAPS, PODS, TRAINJOBS

from .conftest import Raw, TrainJob, configmap, running_pod, trainjob

TJ = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/default/trainjobs"
POD = "/api/v1/namespaces/default/pods"
CM = "/api/v1/namespaces/default/configmaps"


def owned(obj: dict[str, Any], owner: dict[str, Any], *, block: bool = True) -> dict[str, Any]:
    obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": owner["apiVersion"],
            "kind": owner["kind"],
            "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": block,
        }
    ]
    return obj


async def test_background_is_default_and_collects_dependents(
    sim: Simulator, client: AsyncClient, raw: Raw
) -> None:
    owner = sim.store.create(TRAINJOBS, trainjob("t"))
    sim.store.create(CONFIGMAPS, owned(configmap("dep"), owner))
    await client.delete(TrainJob, "t", namespace="default")
    assert not sim.store.exists(TRAINJOBS, "default", "t")
    await raw.until_gone(CM + "/dep")  # the garbage collector's, after the DELETE was answered


async def test_foreground_owner_lingers_until_pods_are_gone(sim: Simulator, raw: Raw) -> None:
    owner = sim.store.create(TRAINJOBS, trainjob("t"))
    sim.store.create(PODS, owned(running_pod("p"), owner))
    code, body, _ = await raw.request("DELETE", TJ + "/t", {"propagationPolicy": "Foreground"})
    assert code == 200  # not deleted at once: 200 with the object (202 only for orphanDependents=false)
    assert body["metadata"]["finalizers"] == ["foregroundDeletion"] and body["metadata"]["deletionTimestamp"]
    pod = sim.store.get(PODS, "default", "p")
    assert pod["metadata"]["deletionGracePeriodSeconds"] == 30  # terminating, gracefully
    assert (await raw.request("GET", TJ + "/t"))[0] == 200
    # What the kubelet does when the container stopped; the collector then lets the owner go.
    code, _, _ = await raw.request("DELETE", POD + "/p", params={"gracePeriodSeconds": "0"})
    assert code == 200
    await raw.until_gone(TJ + "/t")


async def test_orphan_leaves_dependents(sim: Simulator, client: AsyncClient, raw: Raw) -> None:
    owner = sim.store.create(TRAINJOBS, trainjob("t"))
    sim.store.create(CONFIGMAPS, owned(configmap("dep"), owner))
    await client.delete(TrainJob, "t", namespace="default", cascade=CascadeType.ORPHAN)
    # The API server adds the orphan finalizer; the collector strips the references, then the finalizer.
    await raw.until_gone(TJ + "/t")
    dep = await raw.until(CM + "/dep", lambda code, body: code == 200)
    assert "ownerReferences" not in dep["metadata"]


async def test_pod_deletion_is_graceful(sim: Simulator, raw: Raw) -> None:
    pod = running_pod("p")
    pod["spec"]["terminationGracePeriodSeconds"] = 5
    sim.store.create(PODS, pod)
    code, body, _ = await raw.request("DELETE", POD + "/p")
    assert code == 200 and body["metadata"]["deletionGracePeriodSeconds"] == 5
    code, body, _ = await raw.request("GET", POD + "/p")
    assert code == 200 and body["metadata"]["deletionTimestamp"] == "2026-01-01T00:00:05Z"
    code, body, _ = await raw.request("DELETE", POD + "/p", params={"gracePeriodSeconds": "0"})
    assert code == 200 and (await raw.request("GET", POD + "/p"))[0] == 404


async def test_finalizer_removal_completes_deletion(sim: Simulator, raw: Raw) -> None:
    body = trainjob("t")
    body["metadata"]["finalizers"] = ["example.com/cleanup"]
    await raw.request("POST", TJ, body)
    code, out, _ = await raw.request("DELETE", TJ + "/t")
    assert code == 200 and out["metadata"]["deletionTimestamp"]
    code, out, _ = await raw.request(
        "PATCH", TJ + "/t", {"metadata": {"finalizers": None}}, content_type="application/merge-patch+json"
    )
    assert code == 200 and (await raw.request("GET", TJ + "/t"))[0] == 404


async def test_delete_dry_run_keeps_the_object(sim: Simulator, raw: Raw) -> None:
    await raw.request("POST", TJ, trainjob("t"))
    code, _, _ = await raw.request("DELETE", TJ + "/t", params={"dryRun": "All"})
    assert code == 200 and sim.store.exists(TRAINJOBS, "default", "t")


async def test_custom_resource_gone_at_once_answers_a_status(sim: Simulator, raw: Raw) -> None:
    code, created, _ = await raw.request("POST", TJ, trainjob("t"))
    assert code == 201
    code, body, _ = await raw.request("DELETE", TJ + "/t")
    assert code == 200 and body["kind"] == "Status" and body["status"] == "Success"
    assert body["details"] == {
        "name": "t",
        "group": "trainer.kubeflow.org",
        "kind": "trainjobs",
        "uid": created["metadata"]["uid"],
    }


async def test_accepted_only_when_orphan_dependents_false_is_sent(sim: Simulator, raw: Raw) -> None:
    for name in ("a", "b"):
        body = trainjob(name)
        body["metadata"]["finalizers"] = ["example.com/cleanup"]
        await raw.request("POST", TJ, body)
    code, out, _ = await raw.request("DELETE", TJ + "/a", {"orphanDependents": False})
    assert code == 202 and out["metadata"]["deletionTimestamp"]
    code, out, _ = await raw.request("DELETE", TJ + "/b", params={"orphanDependents": "false"})
    assert code == 202 and out["metadata"]["deletionTimestamp"]
    code, body, _ = await raw.request("POST", TJ, trainjob("c"))
    code, out, _ = await raw.request("DELETE", TJ + "/c", {"orphanDependents": False})
    assert code == 200 and out["kind"] == "Status"  # deleted at once: never 202
