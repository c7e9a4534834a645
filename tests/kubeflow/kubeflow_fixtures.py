"""Our own Trainer runtime fixtures (written from the published v2.3.0 stock runtimes' shapes) and
helpers shared by the kubeflow adapter tests."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import yaml

from dispatch import AdapterConfig, Epoch, Identity, Image, JobSpec
from dispatch_kubeflow import RuntimeRef
from kubesim.auth import Rule
from kubesim.kubeconfig import kubeconfig_dict
from kubesim.resources import CLUSTERTRAININGRUNTIMES, TRAININGRUNTIMES
from kubesim.sim import Simulator

TRAINER_STEP = {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}


def _node_job(name: str, image: str, *, trainer: bool = True, **container: Any) -> dict[str, Any]:
    job: dict[str, Any] = {
        "name": name,
        "template": {
            "spec": {"template": {"spec": {"containers": [{"name": "node", "image": image, **container}]}}}
        },
    }
    if trainer:
        job["template"]["metadata"] = {"labels": dict(TRAINER_STEP)}
    return job


def runtime(
    name: str, framework: str, ml_policy: dict[str, Any], jobs: list[dict[str, Any]], **template_spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": framework}},
        "spec": {"mlPolicy": ml_policy, "template": {"spec": {"replicatedJobs": jobs, **template_spec}}},
    }


def torch_runtime(name: str = "torch-distributed") -> dict[str, Any]:
    """Like the stock torch-distributed: one trainer job "node", mlPolicy.torch."""
    return runtime(name, "torch", {"numNodes": 1, "torch": {}}, [_node_job("node", "example.org/pytorch:2")])


def jax_runtime(name: str = "jax-distributed") -> dict[str, Any]:
    """Like the stock jax-distributed: one trainer job "node", mlPolicy.jax."""
    return runtime(name, "jax", {"numNodes": 1, "jax": {}}, [_node_job("node", "example.org/jax:25")])


def deepspeed_runtime(name: str = "deepspeed-distributed") -> dict[str, Any]:
    """Like the stock deepspeed-distributed: MPI; workers "node" (sshd, not labelled) and a labelled
    "launcher" that depends on them; success when the launcher completes."""
    workers = _node_job(
        "node", "example.org/deepspeed:1", trainer=False, command=["/usr/sbin/sshd"], args=["-De"]
    )
    launcher = _node_job("launcher", "example.org/deepspeed:1")
    launcher["dependsOn"] = [{"name": "node", "status": "Ready"}]
    return runtime(
        name,
        "deepspeed",
        {
            "numNodes": 1,
            "mpi": {
                "numProcPerNode": 1,
                "mpiImplementation": "OpenMPI",
                "sshAuthMountPath": "/home/mpiuser/.ssh",
                "runLauncherAsNode": True,
            },
        },
        [workers, launcher],
        network={"publishNotReadyAddresses": True},
        successPolicy={"operator": "All", "targetReplicatedJobs": ["launcher"]},
    )


STOCK = {
    "torch-distributed": torch_runtime,
    "deepspeed-distributed": deepspeed_runtime,
    "jax-distributed": jax_runtime,
}


def broken_runtime(name: str = "broken") -> dict[str, Any]:
    """Breaks every runtime rule at once: two trainer-labelled jobs (the first without a node container),
    a restarting failure policy with rules, and contradictory node bounds."""
    a = _node_job("node", "example.org/x:1")
    a["template"]["spec"]["template"]["spec"]["containers"][0]["name"] = "main"
    b = _node_job("other", "example.org/x:1")
    rt = runtime(
        name,
        "jax",
        {"jax": {}},
        [a, b],
        failurePolicy={"maxRestarts": 3, "rules": [{"name": "retry-all", "action": "RestartJobSet"}]},
    )
    rt["metadata"]["annotations"] = {"dispatch.dev/min-nodes": "4", "dispatch.dev/max-nodes": "2"}
    return rt


def variant(base: dict[str, Any], name: str) -> dict[str, Any]:
    out = copy.deepcopy(base)
    out["metadata"]["name"] = name
    return out


def spec(runtime_name: str = "torch-distributed", **kw: Any) -> JobSpec:
    exts = kw.pop("extensions", None)
    if exts is None:
        exts = [Image("example.org/train:1"), RuntimeRef(runtime_name)]
    kw.setdefault("command", ("python", "train.py"))
    return JobSpec(extensions=exts, **kw)


def ident(job_id: str = "train-1", n: int = 1, r: int = 0) -> Identity:
    return Identity(job_id, Epoch(n, r))


def config(
    settings: dict[str, Any], *, token: str | None = None, read_only: bool = False, store_id: str = ""
) -> AdapterConfig:
    return AdapterConfig(
        "kubeflow", json.dumps(settings).encode(), read_only=read_only, token=token, store_id=store_id
    )


def install(sim: Simulator, *runtimes: dict[str, Any], namespace: str = "default") -> None:
    """Create runtimes straight in the store (test setup; the adapter only ever talks HTTP)."""
    for rt in runtimes:
        obj = copy.deepcopy(rt)
        if obj["kind"] == "TrainingRuntime":
            obj["metadata"]["namespace"] = namespace
            sim.store.create(TRAININGRUNTIMES, obj)
        else:
            sim.store.create(CLUSTERTRAININGRUNTIMES, obj)


def kubeconfig(path: Path, server: str, token: str) -> str:
    path.write_text(yaml.safe_dump(kubeconfig_dict(server, token)))
    path.chmod(0o600)
    return str(path)


_CACHED = {
    "trainjobs": "TRAINJOBS",
    "jobsets": "JOBSETS",
    "jobs": "JOBS",
    "pods": "PODS",
    "workloads": "WORKLOADS",
    "clustertrainingruntimes": "CLUSTERTRAININGRUNTIMES",
    "trainingruntimes": "TRAININGRUNTIMES",
}


async def caught_up(backend: Any, sim: Simulator, *, tries: int = 2000, but: tuple[str, ...] = ()) -> None:
    """Return once the backend's shared cache (its informer) holds exactly what kubesim holds, object by
    object and resourceVersion by resourceVersion: the backend reads from its cache, fed by the watch over
    HTTP, so a test that changes the cluster waits for the change to arrive before it reads. No timing is
    asserted: it waits on what the cache holds (and gives up, failing, after ``tries`` turns). ``but``: kinds
    not waited for (a watch the test makes lag)."""
    import asyncio

    from kubesim import resources

    informer = backend.informer
    await informer.sync()
    for _ in range(tries):
        behind = []
        for kind in informer.kinds:
            if kind.key in but:
                continue
            rt = getattr(resources, _CACHED[kind.key])
            ns = None if kind.key == "clustertrainingruntimes" else backend.settings.namespace
            items, _ = sim.store.list(rt, ns, label_selector=kind.selector)
            want = {i["metadata"]["uid"]: i["metadata"]["resourceVersion"] for i in items}
            if informer.versions(kind.key) != want:
                behind.append(kind.key)
        if not behind:
            return
        await asyncio.sleep(0.002)
    raise AssertionError(f"the backend's cache did not catch up with kubesim: {behind}")


def manifest_rules(manifests: list[dict[str, Any]]) -> list[Rule]:
    """The ClusterRole and Role rules of deploy/ manifests, as kubesim rules (no resourceNames: kubesim's
    rules cannot express them, and the manifests must not need them)."""
    out = []
    for m in manifests:
        if m["kind"] not in ("ClusterRole", "Role"):
            continue
        ns = m["metadata"].get("namespace") if m["kind"] == "Role" else None
        for r in m["rules"]:
            assert "resourceNames" not in r and "nonResourceURLs" not in r
            assert "*" not in r["verbs"] and "*" not in r["resources"], "least RBAC: no wildcards"
            out.append(Rule.of(r["verbs"], r["apiGroups"], r["resources"], ns))
    return out
