"""Trainer v2.3.0 as it misbehaves on a real cluster, over real HTTP: the JobSet that comes back while
its TrainJob is deleted in the foreground (the deletion never finishes), and an unreachable webhook."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubesim import Simulator
from kubesim.resources import JOBSETS, PODS, TRAINJOBS

from .conftest import call

NS = "default"
TRAINJOBS_PATH = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NS}/trainjobs"


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    async with Simulator(recreate_jobset_while_deleting=True) as s:
        yield s


def trainjob(name: str, nodes: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": nodes, "env": [{"name": "KUBESIM_SCRIPT", "value": "hang"}]},
        },
    }


def jobset_uid(sim: Simulator, name: str) -> str | None:
    found = [j for j in sim.store.list(JOBSETS, NS)[0] if j["metadata"]["name"] == name]
    return found[0]["metadata"]["uid"] if found else None


def live_pods(sim: Simulator, name: str) -> set[str]:
    pods = sim.store.list(PODS, NS, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}")[0]
    return {p["metadata"]["uid"] for p in pods if not p["metadata"].get("deletionTimestamp")}


async def test_foreground_deletion_never_finishes_while_the_jobset_comes_back(sim: Simulator) -> None:
    code, body = await call(sim, "POST", TRAINJOBS_PATH, trainjob("loop"))
    assert code == 201, body
    await sim.settle()
    first_pods = live_pods(sim, "loop")
    assert len(first_pods) == 2
    code, body = await call(sim, "DELETE", f"{TRAINJOBS_PATH}/loop", propagationPolicy="Foreground")
    assert code == 200, body
    assert body["metadata"]["deletionTimestamp"] and "foregroundDeletion" in body["metadata"]["finalizers"]

    jobsets: set[str] = set()
    pods: set[str] = set()
    for _ in range(240):  # two simulated minutes, half a second at a time
        sim.advance(0.5)
        uid = jobset_uid(sim, "loop")
        if uid is not None:
            jobsets.add(uid)
        pods |= live_pods(sim, "loop")
    # The JobSet came back several times, each time with Jobs and running pods, and the TrainJob stays.
    assert len(jobsets) >= 3, jobsets
    assert len(pods - first_pods) >= 4
    code, body = await call(sim, "GET", f"{TRAINJOBS_PATH}/loop")
    assert code == 200 and body["metadata"]["deletionTimestamp"]

    # A Trainer that stops re-applying (a fixed version) lets the deletion finish.
    sim.recreate_jobset_while_deleting = False
    sim.advance(60)
    code, body = await call(sim, "GET", f"{TRAINJOBS_PATH}/loop")
    assert code == 404, body
    assert sim.store.list(PODS, NS)[0] == []


async def test_background_deletion_finishes_even_with_the_recreating_trainer(sim: Simulator) -> None:
    code, body = await call(sim, "POST", TRAINJOBS_PATH, trainjob("bg"))
    assert code == 201, body
    await sim.settle()
    code, body = await call(sim, "DELETE", f"{TRAINJOBS_PATH}/bg", propagationPolicy="Background")
    assert code == 200, body
    sim.advance(60)
    assert not sim.store.exists(TRAINJOBS, NS, "bg")
    assert jobset_uid(sim, "bg") is None and sim.store.list(PODS, NS)[0] == []


async def test_the_switch_is_on_by_default_and_turns_off() -> None:
    """On by default (Trainer v2.3.0, which dispatch's stop converges on); off, a foreground delete ends."""
    async with Simulator() as sim:
        assert sim.recreate_jobset_while_deleting
    async with Simulator(recreate_jobset_while_deleting=False) as sim:
        code, body = await call(sim, "POST", TRAINJOBS_PATH, trainjob("once"))
        assert code == 201, body
        await sim.settle()
        code, body = await call(sim, "DELETE", f"{TRAINJOBS_PATH}/once", propagationPolicy="Foreground")
        assert code == 200, body
        sim.advance(60)
        code, body = await call(sim, "GET", f"{TRAINJOBS_PATH}/once")
        assert code == 404, body


async def test_unavailable_trainer_webhook_fails_writes_with_500(sim: Simulator) -> None:
    code, body = await call(sim, "POST", TRAINJOBS_PATH, trainjob("before"))
    assert code == 201, body
    sim.faults.webhooks_unavailable("trainer")
    code, body = await call(sim, "POST", TRAINJOBS_PATH, trainjob("during"))
    assert code == 500
    assert (body["reason"], body["code"]) == ("InternalError", 500)
    assert body["message"] == (
        'Internal error occurred: failed calling webhook "defaulter.trainjob.trainer.kubeflow.org": '
        'failed to call webhook: Post "https://kubeflow-trainer-controller-manager.kubeflow-system.svc:443/'
        'mutate-trainer-kubeflow-org-v1alpha1-trainjob?timeout=10s": dial tcp 10.96.183.62:443: connect: '
        "connection refused"
    )
    assert body["details"]["causes"][0]["message"].startswith('failed calling webhook "defaulter.')
    # An update of the TrainJob is intercepted too; the status subresource and deletes are not.
    patch = {"metadata": {"labels": {"x": "y"}}}
    merge = "application/merge-patch+json"
    code, body = await call(sim, "PATCH", f"{TRAINJOBS_PATH}/before", patch, ctype=merge)
    assert code == 500 and "failed calling webhook" in body["message"]
    status = {"status": {"conditions": []}}
    code, body = await call(sim, "PATCH", f"{TRAINJOBS_PATH}/before/status", status, ctype=merge)
    assert code == 200, body
    code, body = await call(sim, "DELETE", f"{TRAINJOBS_PATH}/before")
    assert code == 200, body
    sim.faults.webhooks_available("trainer")
    code, body = await call(sim, "POST", TRAINJOBS_PATH, trainjob("after"))
    assert code == 201, body
    with pytest.raises(ValueError, match="components: trainer"):
        sim.faults.webhooks_unavailable("kueue")
