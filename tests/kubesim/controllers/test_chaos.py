"""Randomised runs (fixed seeds) of many TrainJobs with every scripted behaviour and cluster disruption,
checking cluster-wide invariants after every step."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from kubesim.controllers import conditions as cond
from kubesim.controllers.quantity import parse_quantity
from kubesim.resources import (
    CLUSTERQUEUES,
    JOBS,
    JOBSETS,
    NODES,
    PODS,
    TRAINJOBS,
    WORKLOADPRIORITYCLASSES,
    WORKLOADS,
)
from kubesim.sim import Simulator

SCRIPTS = [
    "exit 0",
    "sleep 30; exit 0",
    "sleep 10; exit 3",
    "sleep 5; oom",
    "print x; env:E=1: preempt; sleep 20; exit 0",
    "sleep 15; lose-node; hang",
    "sleep 5; evict; hang",
    "hang",
    "rank=1: exit 2; sleep 40; exit 0",
    "slow-stop 50; sleep 100; exit 0",
    "bogus verb",
]


def check_invariants(sim: Simulator) -> None:
    errors = [e for c in sim.controllers for e in getattr(c, "errors", [])]
    assert errors == []
    tjs = {t["metadata"]["uid"]: t for t in sim.store.list(TRAINJOBS)[0]}
    # Every JobSet and Workload belongs to a live TrainJob (owner GC works), or is being deleted: a
    # foreground deletion that a later background DELETE of its owner overtook (the owner loses its
    # foregroundDeletion finalizer and goes, as the generic registry does) waits for its own dependents.
    for rt in (JOBSETS, WORKLOADS):
        for obj in sim.store.list(rt)[0]:
            owners = [r["uid"] for r in obj["metadata"].get("ownerReferences") or []]
            terminating = bool(obj["metadata"].get("deletionTimestamp"))
            assert terminating or any(u in tjs for u in owners), (rt.kind, obj["metadata"]["name"])
    # At most one live (not terminating, not finished) pod per Job index.
    live = Counter(
        (
            p["metadata"]["labels"]["batch.kubernetes.io/job-name"],
            p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"],
        )
        for p in sim.store.list(PODS)[0]
        if not p["metadata"].get("deletionTimestamp")
        and p["status"].get("phase") not in ("Succeeded", "Failed")
    )
    assert all(n == 1 for n in live.values()), live
    # A suspended Job has no live pods.
    for job in sim.store.list(JOBS)[0]:
        if job["spec"].get("suspend"):
            assert not [k for k in live if k[0] == job["metadata"]["name"]], job["metadata"]["name"]
    # Quota is never over-committed.
    cq = sim.store.get(CLUSTERQUEUES, None, "cluster-queue")
    nominal = {
        r["name"]: parse_quantity(r["nominalQuota"])
        for r in cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"]
    }
    used: Counter[str] = Counter()
    for wl in sim.store.list(WORKLOADS)[0]:
        if cond.is_true(wl, "QuotaReserved") and not cond.is_true(wl, "Finished"):
            for psa in wl["status"]["admission"]["podSetAssignments"]:
                for res, amount in psa["resourceUsage"].items():
                    used[res] += parse_quantity(amount)
    assert all(used[r] <= nominal.get(r, 0) + 1e-9 for r in used), (used, nominal)
    # Pods are bound only to nodes that exist, and never while gated.
    nodes = {n["metadata"]["name"] for n in sim.store.list(NODES)[0]}
    for p in sim.store.list(PODS)[0]:
        if p["spec"].get("nodeName"):
            assert p["spec"]["nodeName"] in nodes
            assert not p["spec"].get("schedulingGates")


@pytest.mark.parametrize("seed", [1, 7, 19, 53, 149])  # 19, 53, 149 once found real bugs
def test_random_workloads_keep_invariants(seed: int) -> None:
    rnd = random.Random(seed)
    sim = Simulator(nodes=6)
    for name, value in (("lo", 10), ("hi", 100)):
        sim.store.create(
            WORKLOADPRIORITYCLASSES,
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "WorkloadPriorityClass",
                "metadata": {"name": name},
                "value": value,
            },
        )
    names: list[str] = []
    for step in range(40):
        op = rnd.random()
        if op < 0.5:
            labels = {"kueue.x-k8s.io/queue-name": "user-queue"} if rnd.random() < 0.6 else {}
            if labels and rnd.random() < 0.4:
                labels["kueue.x-k8s.io/priority-class"] = rnd.choice(["lo", "hi"])
            body = {
                "apiVersion": "trainer.kubeflow.org/v1alpha1",
                "kind": "TrainJob",
                "metadata": {"name": f"j{step}", "namespace": "default", "labels": labels},
                "spec": {
                    "runtimeRef": {
                        "name": rnd.choice(["torch-distributed", "jax-distributed", "deepspeed-distributed"])
                    },
                    "trainer": {
                        "image": rnd.choice(["example.org/train:1", "registry.invalid/train:1"]),
                        "numNodes": rnd.randint(1, 3),
                        "resourcesPerNode": {"requests": {"cpu": str(rnd.choice([1, 4, 8, 16]))}},
                        "env": [
                            {"name": "KUBESIM_SCRIPT", "value": rnd.choice(SCRIPTS)},
                            {"name": "E", "value": rnd.choice(["1", "2"])},
                        ],
                    },
                },
            }
            if rnd.random() < 0.2:
                body["spec"]["activeDeadlineSeconds"] = rnd.randint(5, 100)
            sim.store.create(TRAINJOBS, body)
            names.append(f"j{step}")
        elif op < 0.6 and names:
            name = rnd.choice(names)
            if sim.store.exists(TRAINJOBS, "default", name):
                sim.store.delete(
                    TRAINJOBS, "default", name, propagation=rnd.choice(["Foreground", "Background"])
                )
        elif op < 0.7 and names:
            name = rnd.choice(names)
            if sim.store.exists(TRAINJOBS, "default", name):
                tj = sim.store.get(TRAINJOBS, "default", name)
                if "kueue.x-k8s.io/queue-name" not in tj["metadata"]["labels"]:
                    tj["spec"]["suspend"] = not tj["spec"]["suspend"]
                    sim.store.replace(TRAINJOBS, tj)
        elif op < 0.8:
            sim.actions.restore_node(
                rnd.choice(sorted(n["metadata"]["name"] for n in sim.store.list(NODES)[0]))
            )
        else:
            running = [
                p
                for p in sim.store.list(PODS)[0]
                if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
            ]
            if running:
                sim.actions.preempt("default", rnd.choice(running)["metadata"]["name"])
        sim.settle_now()
        check_invariants(sim)
        sim.advance(rnd.choice([1, 5, 30, 120]))
        check_invariants(sim)
    sim.advance(3000)
    check_invariants(sim)
    # Deleted TrainJobs left nothing behind.
    alive = {t["metadata"]["name"] for t in sim.store.list(TRAINJOBS)[0]}
    assert {
        p["metadata"]["labels"]["jobset.sigs.k8s.io/jobset-name"] for p in sim.store.list(PODS)[0]
    } <= alive
