"""Pure Trainer logic: resolve a TrainJob's runtime and build the JobSet it runs as (Trainer v2.3 rules).

The controller (``trainer.py``) reads objects from the store and writes the result; everything deciding
*what* the JobSet looks like lives here so it can be tested alone.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from kubesim.controllers.smp import merge_template, upsert_by_key

__all__ = [
    "ANCESTOR_LABEL",
    "GROUP",
    "KUEUE_MANAGER",
    "BuildError",
    "PodSet",
    "build_jobset",
    "framework_of",
    "registry_key",
    "runtime_pod_sets",
]

GROUP = "trainer.kubeflow.org"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
KUEUE_MANAGER = "kueue.x-k8s.io/manager"
TRAINER_PORT = 29500
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
SUPPORTED_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")

TORCH_RESERVED = ("PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE")
MPI_RESERVED = (
    "OMPI_MCA_orte_default_hostfile",
    "OMPI_MCA_orte_keep_fqdn_hostnames",
    "OMPI_MCA_orte_set_default_slots",
    "OMPI_MCA_plm_rsh_args",
)
XGBOOST_RESERVED = ("DMLC_NUM_WORKER", "DMLC_TASK_ID", "DMLC_TRACKER_PORT", "DMLC_TRACKER_URI")


class BuildError(Exception):
    """The JobSet cannot be built (shown by the controller as an Event on the TrainJob)."""


def registry_key(trainjob: dict[str, Any]) -> str:
    """``<Kind>.<apiGroup>`` of the runtimeRef, as Trainer keys its runtime registry."""
    ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
    return f"{ref.get('kind', '')}.{ref.get('apiGroup', '')}"


def is_supported(trainjob: dict[str, Any]) -> bool:
    ref = (trainjob.get("spec") or {}).get("runtimeRef") or {}
    return ref.get("apiGroup") == GROUP and ref.get("kind") in SUPPORTED_KINDS


def framework_of(runtime: dict[str, Any]) -> str:
    """Which ML policy plugin applies: ``torch``, ``mpi``, ``jax``, ``xgboost``, ``flux`` or ``plain``."""
    ml = (runtime.get("spec") or {}).get("mlPolicy") or {}
    for name in ("torch", "mpi", "jax", "xgboost", "flux"):
        if ml.get(name) is not None:
            return name
    return "plain"


@dataclass
class PodSet:
    """One replicated job's pod set as Trainer's runtime info sees it."""

    name: str
    ancestor: str | None
    count: int


def _rjobs(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return list(spec.get("replicatedJobs") or [])


def _ancestor(rjob: dict[str, Any]) -> str | None:
    labels = ((rjob.get("template") or {}).get("metadata") or {}).get("labels") or {}
    value = labels.get(ANCESTOR_LABEL)
    return str(value) if value is not None else None


def _pod_spec(rjob: dict[str, Any]) -> dict[str, Any]:
    tmpl = rjob.setdefault("template", {})
    job_spec = tmpl.setdefault("spec", {})
    pod_tmpl = job_spec.setdefault("template", {})
    return pod_tmpl.setdefault("spec", {})  # type: ignore[no-any-return]


def _node_container(rjob: dict[str, Any]) -> dict[str, Any] | None:
    for c in _pod_spec(rjob).get("containers") or []:
        if c.get("name") == "node":
            return c  # type: ignore[no-any-return]
    return None


def _merged_template(
    trainjob: dict[str, Any], runtime: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, str], dict[str, str]]:
    """The runtime's JobSet template with every runtime patch merged, plus propagated labels/annotations."""
    template = copy.deepcopy((runtime.get("spec") or {}).get("template") or {})
    meta = template.get("metadata") or {}
    labels = dict(meta.get("labels") or {})
    annotations = dict(meta.get("annotations") or {})
    spec = template.setdefault("spec", {})
    for patch in (trainjob.get("spec") or {}).get("runtimePatches") or []:
        tmpl_patch = ((patch.get("trainingRuntimeSpec") or {}).get("template")) or {}
        pmeta = tmpl_patch.get("metadata") or {}
        labels.update(pmeta.get("labels") or {})
        annotations.update(pmeta.get("annotations") or {})
        for rpatch in (tmpl_patch.get("spec") or {}).get("replicatedJobs") or []:
            if rpatch.get("template") is None:
                continue
            for rjob in _rjobs(spec):
                if rjob.get("name") == rpatch.get("name"):
                    rjob["template"] = merge_template(rjob.get("template") or {}, rpatch["template"])
    return template, labels, annotations


def runtime_pod_sets(trainjob: dict[str, Any], runtime: dict[str, Any]) -> list[PodSet]:
    """The pod sets (name, ancestor, count) after the ML policy plugins ran."""
    template, _, _ = _merged_template(trainjob, runtime)
    return _pod_sets(trainjob, runtime, template.get("spec") or {})


def _pod_sets(trainjob: dict[str, Any], runtime: dict[str, Any], jobset_spec: dict[str, Any]) -> list[PodSet]:
    ml = (runtime.get("spec") or {}).get("mlPolicy")
    trainer = (trainjob.get("spec") or {}).get("trainer") or {}
    fw = framework_of(runtime)
    sets: list[PodSet] = []
    for rjob in _rjobs(jobset_spec):
        anc = _ancestor(rjob)
        count = int(((rjob.get("template") or {}).get("spec") or {}).get("parallelism") or 1)
        if anc == "trainer" and ml is not None:
            count = int(ml.get("numNodes") or 1)
        sets.append(PodSet(str(rjob.get("name")), anc, count))
    num_nodes = trainer.get("numNodes")
    if num_nodes is not None:
        if fw in ("torch", "jax", "xgboost", "plain", "flux"):
            for ps in sets:
                if ps.ancestor == "trainer":
                    ps.count = int(num_nodes)
        elif fw == "mpi":
            launcher_as_node = bool(((ml or {}).get("mpi") or {}).get("runLauncherAsNode"))
            for ps in sets:
                if ps.name == "node":
                    ps.count = max(int(num_nodes) - 1, 1) if launcher_as_node else int(num_nodes)
    return sets


def _resources_per_node(trainjob: dict[str, Any], runtime_node: dict[str, Any] | None) -> dict[str, Any]:
    trainer = (trainjob.get("spec") or {}).get("trainer") or {}
    if trainer.get("resourcesPerNode") is not None:
        return dict(trainer["resourcesPerNode"])
    return dict((runtime_node or {}).get("resources") or {})


def _quantity_int(value: Any) -> int:
    from kubesim.controllers.quantity import parse_quantity

    try:
        return int(parse_quantity(value))
    except ValueError:
        return 0


def _nproc_per_node(trainjob: dict[str, Any], resources: dict[str, Any]) -> str:
    trainer = (trainjob.get("spec") or {}).get("trainer") or {}
    if trainer.get("numProcPerNode") is not None:
        return str(int(trainer["numProcPerNode"]))
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    gpu = _quantity_int(limits.get("nvidia.com/gpu", requests.get("nvidia.com/gpu", 0)))
    if gpu > 0:
        return "auto"
    cpu = requests.get("cpu")
    cpu_n = _quantity_int(cpu) if cpu not in (None, 0, "0") else _quantity_int(limits.get("cpu", 0))
    return str(max(1, cpu_n))


def _env(name: str, value: str) -> dict[str, Any]:
    return {"name": name, "value": value}


def _env_from_index(name: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}}


def _upsert_port(container: dict[str, Any], port: int) -> None:
    container["ports"] = upsert_by_key(
        container.get("ports") or [], [{"containerPort": port}], "containerPort"
    )


def build_jobset(trainjob: dict[str, Any], runtime: dict[str, Any]) -> dict[str, Any]:
    """The JobSet Trainer would server-side apply for ``trainjob`` on ``runtime``.

    Same name and namespace as the TrainJob, owned by it; replicated jobs from the runtime template with
    runtime patches merged, trainer/initializer overrides applied and the framework's env injected.
    """
    meta = trainjob.get("metadata") or {}
    name = str(meta.get("name"))
    spec = trainjob.get("spec") or {}
    trainer = spec.get("trainer") or {}
    template, labels, annotations = _merged_template(trainjob, runtime)
    js_spec: dict[str, Any] = template.get("spec") or {}
    if not _rjobs(js_spec):
        raise BuildError("runtime template has no replicatedJobs")
    fw = framework_of(runtime)
    ml = (runtime.get("spec") or {}).get("mlPolicy") or {}
    pod_sets = _pod_sets(trainjob, runtime, js_spec)
    trainer_env = list(trainer.get("env") or [])

    for rjob, ps in zip(_rjobs(js_spec), pod_sets, strict=True):
        job_spec = rjob.setdefault("template", {}).setdefault("spec", {})
        job_spec["parallelism"] = ps.count
        job_spec["completions"] = ps.count
        node = _node_container(rjob)
        if ps.ancestor == "trainer" and node is not None and trainer.get("resourcesPerNode") is not None:
            node["resources"] = copy.deepcopy(trainer["resourcesPerNode"])
        if ps.ancestor == "trainer":
            rjob["replicas"] = 1
            if node is not None:
                if trainer.get("image") is not None:
                    node["image"] = trainer["image"]
                if trainer.get("command") is not None:
                    node["command"] = list(trainer["command"])
                if trainer.get("args") is not None:
                    node["args"] = list(trainer["args"])
        launcher_as_node = fw == "mpi" and bool((ml.get("mpi") or {}).get("runLauncherAsNode"))
        if node is not None and (ps.ancestor == "trainer" or (launcher_as_node and ps.name == "node")):
            node["env"] = upsert_by_key(node.get("env") or [], trainer_env)
        if ps.ancestor in ("dataset-initializer", "model-initializer"):
            rjob["replicas"] = 1
            _apply_initializer(rjob, ps.ancestor, spec.get("initializer") or {})

    _apply_framework(fw, ml, trainjob, js_spec, pod_sets)
    js_spec["suspend"] = bool(spec.get("suspend", False))

    jobset: dict[str, Any] = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": meta.get("namespace"),
            "ownerReferences": [
                {
                    "apiVersion": f"{GROUP}/v1alpha1",
                    "kind": "TrainJob",
                    "name": name,
                    "uid": meta.get("uid"),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": js_spec,
    }
    if labels:
        jobset["metadata"]["labels"] = labels
    if annotations:
        jobset["metadata"]["annotations"] = annotations
    return jobset


def _apply_initializer(rjob: dict[str, Any], ancestor: str, initializer: dict[str, Any]) -> None:
    which = initializer.get("dataset" if ancestor == "dataset-initializer" else "model")
    if not which:
        return
    for c in _pod_spec(rjob).get("containers") or []:
        if c.get("name") != ancestor:
            continue
        env = list(c.get("env") or [])
        if which.get("storageUri") is not None:
            env = upsert_by_key(env, [_env("STORAGE_URI", str(which["storageUri"]))])
        env = upsert_by_key(env, list(which.get("env") or []))
        c["env"] = env
        if which.get("secretRef"):
            c.setdefault("envFrom", []).append({"secretRef": {"name": which["secretRef"].get("name")}})


def _apply_framework(
    fw: str, ml: dict[str, Any], trainjob: dict[str, Any], js_spec: dict[str, Any], pod_sets: list[PodSet]
) -> None:
    name = str((trainjob.get("metadata") or {}).get("name"))
    trainer_rjob = next(
        (r for r, ps in zip(_rjobs(js_spec), pod_sets, strict=True) if ps.ancestor == "trainer"), None
    )
    trainer_ps = next((ps for ps in pod_sets if ps.ancestor == "trainer"), None)
    node = _node_container(trainer_rjob) if trainer_rjob is not None else None
    has_trainer = (trainjob.get("spec") or {}).get("trainer") is not None
    if fw == "torch" and node is not None and has_trainer:
        resources = _resources_per_node(trainjob, node)
        count = trainer_ps.count if trainer_ps else 1
        node["env"] = upsert_by_key(
            node.get("env") or [],
            [
                _env("PET_NNODES", str(count)),
                _env("PET_NPROC_PER_NODE", _nproc_per_node(trainjob, resources)),
                _env_from_index("PET_NODE_RANK"),
                _env("PET_MASTER_ADDR", f"{name}-node-0-0.{name}"),
                _env("PET_MASTER_PORT", str(TRAINER_PORT)),
            ],
        )
        _upsert_port(node, TRAINER_PORT)
    elif fw == "jax" and node is not None and has_trainer:
        count = trainer_ps.count if trainer_ps else 1
        node["env"] = upsert_by_key(
            node.get("env") or [],
            [
                _env("JAX_NUM_PROCESSES", str(count)),
                _env_from_index("JAX_PROCESS_ID"),
                _env("JAX_COORDINATOR_ADDRESS", f"{name}-node-0-0.{name}:{TRAINER_PORT}"),
            ],
        )
        _upsert_port(node, TRAINER_PORT)
    elif fw == "xgboost" and node is not None and has_trainer:
        count = trainer_ps.count if trainer_ps else 1
        node["env"] = upsert_by_key(
            node.get("env") or [],
            [
                _env("DMLC_TRACKER_URI", f"{name}-node-0-0.{name}"),
                _env("DMLC_TRACKER_PORT", "9091"),
                _env_from_index("DMLC_TASK_ID"),
                _env("DMLC_NUM_WORKER", str(count)),
            ],
        )
    elif fw == "mpi":
        _apply_mpi(ml.get("mpi") or {}, trainjob, js_spec)


def _apply_mpi(mpi: dict[str, Any], trainjob: dict[str, Any], js_spec: dict[str, Any]) -> None:
    name = str((trainjob.get("metadata") or {}).get("name"))
    trainer = (trainjob.get("spec") or {}).get("trainer") or {}
    slots = int(trainer.get("numProcPerNode") or mpi.get("numProcPerNode") or 1)
    mount = str(mpi.get("sshAuthMountPath") or "/root/.ssh")
    for rjob in _rjobs(js_spec):
        rname = rjob.get("name")
        if rname not in ("node", "launcher"):
            continue
        pod = _pod_spec(rjob)
        vols = [
            {
                "name": "mpi-ssh-auth",
                "secret": {
                    "secretName": f"{name}-mpi-ssh-auth",
                    "items": [
                        {"key": "ssh-privatekey", "path": "id_rsa"},
                        {"key": "ssh-publickey", "path": "id_rsa.pub"},
                        {"key": "ssh-publickey", "path": "authorized_keys"},
                    ],
                },
            }
        ]
        if rname == "launcher":
            vols.append(
                {
                    "name": "mpi-hostfile",
                    "configMap": {
                        "name": f"{name}-mpi-hostfile",
                        "items": [{"key": "hostfile", "path": "hostfile", "mode": 0o444}],
                    },
                }
            )
        pod["volumes"] = upsert_by_key(pod.get("volumes") or [], vols)
        for c in pod.get("containers") or []:
            if c.get("name") != "node":
                continue
            mounts = [{"name": "mpi-ssh-auth", "mountPath": mount}]
            if rname == "launcher":
                mounts.append({"name": "mpi-hostfile", "mountPath": "/etc/mpi"})
                c["env"] = upsert_by_key(
                    c.get("env") or [],
                    [
                        _env("OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile"),
                        _env("OMPI_MCA_orte_keep_fqdn_hostnames", "true"),
                        _env("OMPI_MCA_orte_set_default_slots", str(slots)),
                        _env("OMPI_MCA_plm_rsh_args", "-o ConnectionAttempts=10"),
                    ],
                )
            c["volumeMounts"] = upsert_by_key(c.get("volumeMounts") or [], mounts, "mountPath")
