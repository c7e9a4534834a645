"""kubesim's own cluster fixtures: stock-like runtimes, default nodes and a default Kueue setup.

The runtimes are written here (not copied) to have the structure of Trainer v2.3's stock
``torch-distributed``, ``deepspeed-distributed`` and ``jax-distributed`` ClusterTrainingRuntimes.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from kubesim.errors import ApiError
from kubesim.resources import (
    ADMISSIONCHECKS,
    CLUSTERQUEUES,
    CLUSTERTRAININGRUNTIMES,
    CONFIGMAPS,
    LOCALQUEUES,
    NAMESPACES,
    NODES,
    RESOURCEFLAVORS,
    STORAGECLASSES,
    ResourceType,
)

if TYPE_CHECKING:
    from kubesim.store import ObjectStore

__all__ = [
    "DEFAULT_NODE_CAPACITY",
    "add_admission_check",
    "install",
    "install_default_kueue",
    "install_nodes",
    "install_runtimes",
    "kueue_objects",
    "make_node",
    "runtimes",
]

ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
DEFAULT_NODE_CAPACITY = {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": "4", "pods": "110"}


def _runtime(
    name: str, framework: str, ml_policy: dict[str, Any], template_spec: dict[str, Any]
) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {"trainer.kubeflow.org/framework": framework}},
        "spec": {"mlPolicy": ml_policy, "template": {"spec": template_spec}},
    }


def _trainer_job(image: str, **container: Any) -> dict[str, Any]:
    return {
        "name": "node",
        "template": {
            "metadata": {"labels": {ANCESTOR: "trainer"}},
            "spec": {"template": {"spec": {"containers": [{"name": "node", "image": image, **container}]}}},
        },
    }


def runtimes() -> list[dict[str, Any]]:
    """Our ``torch-distributed``, ``deepspeed-distributed`` and ``jax-distributed`` ClusterTrainingRuntimes,
    and ``dispatch-torch``: torch-distributed with Job ``backoffLimit: 0`` and pod ``restartPolicy: Never``."""
    torch = _runtime(
        "torch-distributed",
        "torch",
        {"numNodes": 1, "torch": {}},
        {"replicatedJobs": [_trainer_job("pytorch/pytorch:2.13.0-cuda13.0-cudnn9-runtime")]},
    )
    jax = _runtime(
        "jax-distributed",
        "jax",
        {"numNodes": 1, "jax": {}},
        {"replicatedJobs": [_trainer_job("nvcr.io/nvidia/jax:25.10-py3")]},
    )
    ds_image = "ghcr.io/kubeflow/trainer/deepspeed-runtime"
    worker = {
        "name": "node",
        "template": {
            "spec": {
                "template": {
                    "spec": {
                        "securityContext": {"fsGroup": 1000},
                        "containers": [
                            {
                                "name": "node",
                                "image": ds_image,
                                "securityContext": {"runAsUser": 1000},
                                "command": ["/usr/sbin/sshd"],
                                "args": ["-De", "-f", "/home/mpiuser/.sshd_config"],
                                "readinessProbe": {"tcpSocket": {"port": 2222}, "initialDelaySeconds": 5},
                            }
                        ],
                    }
                }
            }
        },
    }
    launcher = {
        "name": "launcher",
        "dependsOn": [{"name": "node", "status": "Ready"}],
        "template": {
            "metadata": {"labels": {ANCESTOR: "trainer"}},
            "spec": {
                "template": {
                    "spec": {
                        "securityContext": {"fsGroup": 1000},
                        "containers": [
                            {"name": "node", "image": ds_image, "securityContext": {"runAsUser": 1000}}
                        ],
                    }
                }
            },
        },
    }
    deepspeed = _runtime(
        "deepspeed-distributed",
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
        {
            "network": {"publishNotReadyAddresses": True},
            "successPolicy": {"operator": "All", "targetReplicatedJobs": ["launcher"]},
            "replicatedJobs": [worker, launcher],
        },
    )
    # A runtime made for dispatch (docs/kubeflow-trainjob.md): no retry inside the cluster, so a failed
    # node fails the TrainJob at once with its exit code on the pod; retries are the supervisor's job.
    dispatch_torch = copy.deepcopy(torch)
    dispatch_torch["metadata"]["name"] = "dispatch-torch"
    job = dispatch_torch["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    job["backoffLimit"] = 0
    job["template"]["spec"]["restartPolicy"] = "Never"
    return [torch, deepspeed, jax, dispatch_torch]


def make_node(
    name: str,
    capacity: dict[str, str] | None = None,
    *,
    labels: dict[str, str] | None = None,
    taints: list[dict[str, Any]] | None = None,
    index: int = 0,
) -> dict[str, Any]:
    """A Ready simulated Node with ``capacity`` (also its allocatable)."""
    cap = dict(capacity or DEFAULT_NODE_CAPACITY)
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **(labels or {}),
            },
        },
        "spec": {},
        "status": {
            "capacity": cap,
            "allocatable": dict(cap),
            "addresses": [
                {"type": "InternalIP", "address": f"10.0.0.{index + 10}"},
                {"type": "Hostname", "address": name},
            ],
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": None,
                    "lastTransitionTime": None,
                }
            ],
            # Every field a kubelet reports: typed clients (lightkube's Node) require them all.
            "nodeInfo": {
                "machineID": f"{index:032x}",
                "systemUUID": f"00000000-0000-0000-0000-{index:012x}",
                "bootID": f"{index:08x}-0000-4000-8000-000000000000",
                "kernelVersion": "6.12.0-kubesim",
                "osImage": "kubesim",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "containerRuntimeVersion": "containerd://2.1.0",
                "kubeletVersion": "v1.36.2-kubesim",
                "kubeProxyVersion": "",
            },
        },
    }
    if taints:
        node["spec"]["taints"] = taints
    return node


def _create(store: ObjectStore, rt: ResourceType, obj: dict[str, Any]) -> dict[str, Any]:
    """Create, or return the existing object of that name (fixtures are idempotent)."""
    try:
        created = store.create(rt, copy.deepcopy(obj))
    except ApiError as e:
        if e.code != 409:
            raise
        return store.get(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"])
    if rt.has_status and obj.get("status"):
        body = copy.deepcopy(created)
        body["status"] = copy.deepcopy(obj["status"])
        created = store.update_status(rt, body)
    return created


def install_runtimes(store: ObjectStore) -> None:
    for rt_obj in runtimes():
        _create(store, CLUSTERTRAININGRUNTIMES, rt_obj)


def install_nodes(store: ObjectStore, count: int = 4, capacity: dict[str, str] | None = None) -> list[str]:
    """Create ``count`` Ready nodes ``node-0``… with ``capacity`` (16 cpu, 64Gi, 4 GPUs, 110 pods)."""
    from kubesim.clock import rfc3339

    names = []
    for i in range(count):
        node = make_node(f"node-{i}", capacity, index=i)
        now = rfc3339(store.clock.now())
        for c in node["status"]["conditions"]:
            c["lastHeartbeatTime"] = now
            c["lastTransitionTime"] = now
        _create(store, NODES, node)
        names.append(node["metadata"]["name"])
    return names


def kueue_objects(
    *,
    nominal: dict[str, str] | None = None,
    namespace: str = "default",
    admission_checks: list[str] | None = None,
) -> list[tuple[ResourceType, dict[str, Any]]]:
    """The default Kueue setup: flavor ``default``, ClusterQueue ``cluster-queue``, LocalQueue ``user-queue``."""
    quota = nominal or {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "16", "pods": "440"}
    cq_spec: dict[str, Any] = {
        "namespaceSelector": {},
        "queueingStrategy": "BestEffortFIFO",
        "preemption": {
            "withinClusterQueue": "LowerPriority",
            "reclaimWithinCohort": "Never",
            "borrowWithinCohort": {"policy": "Never"},
        },
        "resourceGroups": [
            {
                "coveredResources": sorted(quota),
                "flavors": [
                    {
                        "name": "default",
                        "resources": [{"name": k, "nominalQuota": v} for k, v in sorted(quota.items())],
                    }
                ],
            }
        ],
    }
    if admission_checks:
        cq_spec["admissionChecksStrategy"] = {"admissionChecks": [{"name": n} for n in admission_checks]}
    return [
        (
            RESOURCEFLAVORS,
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": "default"},
                "spec": {},
            },
        ),
        (
            CLUSTERQUEUES,
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": "cluster-queue"},
                "spec": cq_spec,
            },
        ),
        (
            LOCALQUEUES,
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": "user-queue", "namespace": namespace},
                "spec": {"clusterQueue": "cluster-queue"},
            },
        ),
    ]


def add_admission_check(
    store: ObjectStore, name: str, controller_name: str, *, cluster_queue: str = "cluster-queue"
) -> dict[str, Any]:
    """Create AdmissionCheck ``name`` served by ``controller_name`` and list it in ``cluster_queue``'s
    ``admissionChecksStrategy``. Its ``Active`` condition is left to its controller (e.g.
    dispatch-admission): until then the ClusterQueue is inactive."""
    ac = _create(
        store,
        ADMISSIONCHECKS,
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "AdmissionCheck",
            "metadata": {"name": name},
            "spec": {"controllerName": controller_name},
        },
    )
    cq = store.get(CLUSTERQUEUES, None, cluster_queue)
    strategy = cq["spec"].setdefault("admissionChecksStrategy", {})
    checks = strategy.setdefault("admissionChecks", [])
    if not any(c.get("name") == name for c in checks):
        checks.append({"name": name})
        store.replace(CLUSTERQUEUES, cq)
    return ac


def install_default_kueue(store: ObjectStore, **kwargs: Any) -> None:
    """Create :func:`kueue_objects` (idempotent)."""
    for rt, obj in kueue_objects(**kwargs):
        _create(store, rt, obj)


TRAINER_NAMESPACE = "kubeflow-system"
TRAINER_PUBLIC = "kubeflow-trainer-public"
TRAINER_VERSION = "v2.3.0"


def install_trainer_public(store: ObjectStore) -> None:
    """The ``kubeflow-system`` namespace and the ``kubeflow-trainer-public`` ConfigMap a Trainer install
    creates (``manifests/base/manager/kubeflow-trainer-public-configmap.yaml``); the Kubeflow SDK's
    ``TrainerClient()`` reads ``data.kubeflow_trainer_version`` from it and logs a warning without it."""
    _create(
        store, NAMESPACES, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": TRAINER_NAMESPACE}}
    )
    _create(
        store,
        CONFIGMAPS,
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": TRAINER_PUBLIC, "namespace": TRAINER_NAMESPACE},
            "data": {"kubeflow_trainer_version": TRAINER_VERSION},
        },
    )


def install_storage_classes(store: ObjectStore) -> None:
    """Two StorageClasses of kubesim's provisioner: ``standard`` (the default, ``Immediate`` binding)
    and ``wait-for-consumer`` (``WaitForFirstConsumer``), both reclaim policy ``Delete``."""
    for name, mode, default in (
        ("standard", "Immediate", True),
        ("wait-for-consumer", "WaitForFirstConsumer", False),
    ):
        meta: dict[str, Any] = {"name": name}
        if default:
            meta["annotations"] = {"storageclass.kubernetes.io/is-default-class": "true"}
        _create(
            store,
            STORAGECLASSES,
            {
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": meta,
                "provisioner": "kubesim.io/hostpath",
                "reclaimPolicy": "Delete",
                "volumeBindingMode": mode,
                "allowVolumeExpansion": True,
            },
        )


def install(sim: Any) -> None:
    """What ``Simulator()`` installs with its default controllers: the TrainJob CRD (:mod:`kubesim.crds`),
    the stock-like runtimes (unless ``install_runtimes=False``), nodes (``nodes=None`` → 4 default nodes; an
    int → that many; a list of Node dicts → those), and the default Kueue objects when ``kueue=True``."""
    store = sim.store
    install_trainer_public(store)
    server = getattr(sim, "server", None)
    if server is not None:
        # the install's RoleBinding: every authenticated user may get that one ConfigMap
        server.authenticated_reads.add((TRAINER_NAMESPACE, TRAINER_PUBLIC))
    from kubesim.crds import install_crds

    install_crds(store)
    if getattr(sim, "install_runtimes", True):
        install_runtimes(store)
    nodes = getattr(sim, "nodes", None)
    if nodes is None:
        install_nodes(store)
    elif isinstance(nodes, int):
        install_nodes(store, nodes)
    else:
        from kubesim.clock import rfc3339

        for i, node in enumerate(nodes):
            obj = copy.deepcopy(node)
            if "status" not in obj:
                obj = make_node(obj["metadata"]["name"], labels=obj["metadata"].get("labels"), index=i)
            now = rfc3339(store.clock.now())
            for c in obj.get("status", {}).get("conditions") or []:
                c["lastHeartbeatTime"] = c.get("lastHeartbeatTime") or now
                c["lastTransitionTime"] = c.get("lastTransitionTime") or now
            _create(store, NODES, obj)
    install_storage_classes(store)
    if getattr(sim, "kueue", False):
        install_default_kueue(store)
    settle = getattr(sim, "settle_now", None)
    if settle is not None:
        settle()
