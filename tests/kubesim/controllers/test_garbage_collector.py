"""The garbage collector and namespace deleter as kube-controller-manager's (pkg/controller/garbagecollector,
pkg/controller/namespace): asynchronous, after the DELETE returned — nothing is collected until the
controller runs (``settle_now``), as a client sees a cascade complete only by watching or polling."""

from __future__ import annotations

from typing import Any

import pytest

from kubesim.controllers import GarbageCollectorController
from kubesim.controllers.base import owner_ref as ref
from kubesim.resources import CONFIGMAPS, JOBS, NAMESPACES, PODS, TRAINJOBS
from kubesim.sim import Simulator
from kubesim.store import ObjectStore


@pytest.fixture
def sim() -> Simulator:
    return Simulator(controllers=[GarbageCollectorController()], install_runtimes=False)


def cm(name: str, ns: str = "default", **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns, **meta}}


def tj(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"runtimeRef": {"name": "torch"}, "suspend": False},
    }


def pod(name: str, owner: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default", "ownerReferences": [owner]},
        "spec": {"containers": [{"name": "node", "image": "busybox"}], "nodeName": "node-1"},
    }


def test_background_deletes_dependents_after_the_delete_returned(sim: Simulator) -> None:
    store: ObjectStore = sim.store
    owner = store.create(TRAINJOBS, tj("t"))
    store.create(CONFIGMAPS, cm("c", ownerReferences=[ref(owner)]))
    store.create(PODS, pod("p", ref(owner)))
    store.delete(TRAINJOBS, "default", "t")
    assert not store.exists(TRAINJOBS, "default", "t")
    assert store.exists(CONFIGMAPS, "default", "c")  # the DELETE returned; the collector has not run
    sim.settle_now()
    assert not store.exists(CONFIGMAPS, "default", "c")
    assert store.get(PODS, "default", "p")["metadata"]["deletionTimestamp"]  # pods go gracefully


def test_foreground_owner_waits_for_blocking_dependents(sim: Simulator) -> None:
    store = sim.store
    owner = store.create(TRAINJOBS, tj("t"))
    store.create(PODS, pod("p", ref(owner)))
    store.create(CONFIGMAPS, cm("c", ownerReferences=[ref(owner, block=False)]))
    out = store.delete(TRAINJOBS, "default", "t", propagation="Foreground")
    assert out["metadata"]["finalizers"] == ["foregroundDeletion"]
    sim.settle_now()
    assert store.exists(TRAINJOBS, "default", "t")  # the pod, terminating, still blocks it
    assert store.get(PODS, "default", "p")["metadata"]["deletionTimestamp"]
    assert not store.exists(CONFIGMAPS, "default", "c")
    store.finalize_pod_deletion("default", "p")
    assert store.exists(TRAINJOBS, "default", "t")
    sim.settle_now()
    assert not store.exists(TRAINJOBS, "default", "t")


def test_orphan_strips_references_then_the_finalizer_and_jobs_default_to_orphan(sim: Simulator) -> None:
    store = sim.store
    owner = store.create(TRAINJOBS, tj("t"))
    store.create(CONFIGMAPS, cm("c", ownerReferences=[ref(owner)]))
    store.delete(TRAINJOBS, "default", "t", propagation="Orphan")
    assert store.get(TRAINJOBS, "default", "t")["metadata"]["finalizers"] == ["orphan"]
    sim.settle_now()
    assert not store.exists(TRAINJOBS, "default", "t")
    assert "ownerReferences" not in store.get(CONFIGMAPS, "default", "c")["metadata"]
    job = store.create(
        JOBS,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "j", "namespace": "default"},
            "spec": {},
        },
    )
    store.create(CONFIGMAPS, cm("d", ownerReferences=[ref(job)]))
    store.delete(JOBS, "default", "j")  # batch/v1 Jobs: orphan unless told otherwise
    sim.settle_now()
    assert not store.exists(JOBS, "default", "j")
    assert "ownerReferences" not in store.get(CONFIGMAPS, "default", "d")["metadata"]


def test_a_dangling_owner_is_collected(sim: Simulator) -> None:
    gone = {"apiVersion": "v1", "kind": "ConfigMap", "name": "gone", "uid": "no-such-uid"}
    sim.store.create(CONFIGMAPS, cm("c", ownerReferences=[gone]))
    assert sim.store.exists(CONFIGMAPS, "default", "c")
    sim.settle_now()
    assert not sim.store.exists(CONFIGMAPS, "default", "c")


def test_a_surviving_owner_keeps_its_dependent_which_loses_the_others(sim: Simulator) -> None:
    store = sim.store
    a = store.create(TRAINJOBS, tj("a"))
    b = store.create(TRAINJOBS, tj("b"))
    store.create(CONFIGMAPS, cm("c", ownerReferences=[ref(a), {**ref(b), "controller": False}]))
    store.delete(TRAINJOBS, "default", "a")
    sim.settle_now()
    refs = store.get(CONFIGMAPS, "default", "c")["metadata"]["ownerReferences"]
    assert [r["name"] for r in refs] == ["b"]


def test_namespace_deletion_empties_it_then_finalizes_it(sim: Simulator) -> None:
    store = sim.store
    store.create(NAMESPACES, {"metadata": {"name": "team"}})
    store.create(CONFIGMAPS, cm("c", ns="team"))
    store.delete(NAMESPACES, None, "team")
    assert store.exists(CONFIGMAPS, "team", "c")
    sim.settle_now()
    assert not store.exists(CONFIGMAPS, "team", "c")
    assert not store.exists(NAMESPACES, None, "team")
