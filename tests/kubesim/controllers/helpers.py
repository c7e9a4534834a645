"""Helpers for the controller tests: a simulator on a ManualClock (no HTTP), and short object readers."""

from __future__ import annotations

from typing import Any

from kubesim.controllers import conditions as cond
from kubesim.resources import JOBS, JOBSETS, PODS, TRAINJOBS, WORKLOADS
from kubesim.sim import Simulator

NS = "default"


def trainjob(
    name: str = "tj",
    *,
    runtime: str = "torch-distributed",
    nodes: int = 1,
    script: str | None = None,
    image: str = "registry.example.com/train:1",
    env: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    resources: dict[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    """A TrainJob body; ``script`` becomes the ``KUBESIM_SCRIPT`` env var of the trainer."""
    e = dict(env or {})
    if script is not None:
        e["KUBESIM_SCRIPT"] = script
    trainer: dict[str, Any] = {"image": image, "command": ["python", "train.py"], "numNodes": nodes}
    if resources is not None:
        trainer["resourcesPerNode"] = resources
    if e:
        trainer["env"] = [{"name": k, "value": v} for k, v in e.items()]
    body: dict[str, Any] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": NS, "labels": dict(labels or {})},
        "spec": {"runtimeRef": {"name": runtime}, "trainer": trainer, **spec},
    }
    return body


def submit(sim: Simulator, body: dict[str, Any]) -> dict[str, Any]:
    created = sim.store.create(TRAINJOBS, body)
    sim.settle_now()
    return created


def tj(sim: Simulator, name: str = "tj") -> dict[str, Any]:
    return sim.store.get(TRAINJOBS, NS, name)


def jobset(sim: Simulator, name: str = "tj") -> dict[str, Any]:
    return sim.store.get(JOBSETS, NS, name)


def jobs(sim: Simulator, name: str = "tj") -> list[dict[str, Any]]:
    return sim.store.list(JOBS, NS, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}")[0]


def pods(sim: Simulator, name: str = "tj") -> list[dict[str, Any]]:
    items = sim.store.list(PODS, NS, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}")[0]
    return sorted(
        items, key=lambda p: int(p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])
    )


def workload(sim: Simulator, name: str = "tj") -> dict[str, Any]:
    uid = tj(sim, name)["metadata"]["uid"]
    items = sim.store.list(WORKLOADS, NS, label_selector=f"kueue.x-k8s.io/job-uid={uid}")[0]
    assert len(items) == 1, items
    return items[0]


def condition(obj: dict[str, Any], ctype: str) -> dict[str, Any] | None:
    return cond.find(obj, ctype)


def main_status(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["status"]["containerStatuses"] if c["name"] == "node")


def no_controller_errors(sim: Simulator) -> None:
    errors = [e for c in sim.controllers for e in getattr(c, "errors", [])]
    assert errors == [], errors
