"""The adapter's rules for Trainer runtimes (SPEC §9.4), as pure functions of the runtime object.

:func:`check_runtime` returns *every* reason a runtime cannot run a job, so ``capabilities(spec)`` and
``start`` can refuse with all of them at once. The runtime object is whatever the API server returned;
nothing here trusts its shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msgspec import Struct

from dispatch.model import JobSpec
from dispatch_kubeflow.names import DOMAIN, LABEL_ANCESTOR_STEP, NODE_CONTAINER, TRAINER_STEP
from dispatch_kubeflow.objects import as_map

__all__ = [
    "ANNOTATION_MAX_NODES",
    "ANNOTATION_MIN_NODES",
    "RuntimeInfo",
    "check_runtime",
    "describe",
    "inspect_runtime",
    "reserved_env",
]

ANNOTATION_MIN_NODES = f"{DOMAIN}/min-nodes"
ANNOTATION_MAX_NODES = f"{DOMAIN}/max-nodes"
"""A site may state node bounds on a runtime with these annotations (Trainer v2.2+ runtimes have no
bound of their own; v2.0/v2.1 had ``mlPolicy.torch.elasticPolicy.minNodes/maxNodes``, also honoured)."""

FRAMEWORKS = ("torch", "mpi", "jax", "xgboost", "flux")

# Environment names the Trainer injects (and its webhook refuses in trainer.env), per mlPolicy.
_RESERVED_PREFIXES = {"torch": ("PET_",), "mpi": ("OMPI_MCA_",), "xgboost": ("DMLC_",)}
_RESERVED_NAMES = {"jax": ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _dig(value: Any, *keys: str) -> Any:
    for key in keys:
        value = as_map(value).get(key)
    return value


def describe(runtime: Mapping[str, Any], kind: str | None = None) -> str:
    """``ClusterTrainingRuntime "torch-distributed"`` (for messages)."""
    name = _dig(runtime, "metadata", "name")
    return f'{kind or runtime.get("kind") or "runtime"} "{name}"'


class RuntimeInfo(Struct, frozen=True):
    """What the adapter needs to know of a runtime to build a TrainJob on it."""

    framework: str | None
    """The ``mlPolicy`` entry (``torch``, ``mpi``, ``jax``, ``xgboost``, ``flux``) or ``None``."""
    replicated_jobs: tuple[str, ...]
    """Names of every replicated job of the JobSet template, in order."""
    trainer_jobs: tuple[str, ...]
    """Names of the replicated jobs labelled as the trainer step (exactly one in a usable runtime)."""
    node_jobs: tuple[str, ...]
    """Replicated jobs whose pod template has a ``node`` container (they get the checkpoint mount)."""
    min_nodes: int | None
    max_nodes: int | None
    problems: tuple[str, ...]
    """Reasons found while reading the runtime itself (independent of any spec)."""


def _int_annotation(annotations: Mapping[str, Any], key: str, problems: list[str]) -> int | None:
    if key not in annotations:
        return None
    text = annotations[key]
    if isinstance(text, str) and text.isdigit() and int(text) >= 1:
        return int(text)
    problems.append(f"annotation {key}: {text!r} is not a whole number of nodes (at least 1)")
    return None


def inspect_runtime(runtime: Mapping[str, Any]) -> RuntimeInfo:
    """Read a runtime object and note every problem with the rules that do not depend on a job."""
    problems: list[str] = []
    spec = as_map(runtime.get("spec"))
    ml = as_map(spec.get("mlPolicy"))
    frameworks = [f for f in FRAMEWORKS if f in ml]
    framework = frameworks[0] if len(frameworks) == 1 else None
    template_spec = as_map(_dig(spec, "template", "spec"))

    names: list[str] = []
    trainer: list[str] = []
    node_jobs: list[str] = []
    trainer_has_node = False
    jobs = template_spec.get("replicatedJobs")
    if not isinstance(jobs, list) or not jobs:
        problems.append("its JobSet template has no replicated jobs (spec.template.spec.replicatedJobs)")
    for i, job in enumerate(_list(jobs)):
        name = as_map(job).get("name")
        name = name if isinstance(name, str) else f"#{i}"
        names.append(name)
        step = as_map(_dig(job, "template", "metadata", "labels")).get(LABEL_ANCESTOR_STEP)
        containers = _list(_dig(job, "template", "spec", "template", "spec", "containers"))
        has_node = any(as_map(c).get("name") == NODE_CONTAINER for c in containers)
        if has_node:
            node_jobs.append(name)
        if step == TRAINER_STEP:
            trainer.append(name)
            trainer_has_node = has_node
    if jobs and not trainer:
        problems.append(
            f"no replicated job is labelled {LABEL_ANCESTOR_STEP}: {TRAINER_STEP}; exactly one must be"
        )
    elif len(trainer) > 1:
        problems.append(
            f"{len(trainer)} replicated jobs ({', '.join(trainer)}) are labelled {LABEL_ANCESTOR_STEP}: "
            f"{TRAINER_STEP}; exactly one must be"
        )
    elif trainer and not trainer_has_node:
        problems.append(
            f'the trainer replicated job "{trainer[0]}" has no container named "{NODE_CONTAINER}" in its pod template'
        )

    failure = template_spec.get("failurePolicy")
    if failure is not None:
        failure = as_map(failure)
        restarts = failure.get("maxRestarts")
        if isinstance(restarts, int) and not isinstance(restarts, bool) and restarts > 0:
            problems.append(
                f"its JobSet failurePolicy restarts the job on its own (maxRestarts: {restarts}); restarts are the "
                "supervisor's job, so the runtime must not restart (maxRestarts 0 or no failurePolicy)"
            )
        # A rule that fails the JobSet restarts nothing; every other action (RestartJobSet, RestartJob, the
        # ...AndIgnoreMaxRestarts ones, or one this version does not know) may restart inside the cluster.
        restarting = [
            (i, r)
            for i, r in enumerate(_list(failure.get("rules")))
            if as_map(r).get("action") != "FailJobSet"
        ]
        if restarting:
            names_of = [str(as_map(r).get("name") or f"#{i}") for i, r in restarting]
            problems.append(
                f"its JobSet failurePolicy has restart rules ({', '.join(names_of)}); restarts inside the cluster hide "
                "causes, so the runtime must have none"
            )

    annotations = as_map(_dig(runtime, "metadata", "annotations"))
    elastic = as_map(_dig(ml, "torch", "elasticPolicy"))
    bounds: list[int | None] = []
    for key, legacy in ((ANNOTATION_MIN_NODES, "minNodes"), (ANNOTATION_MAX_NODES, "maxNodes")):
        value = _int_annotation(annotations, key, problems)
        old = elastic.get(legacy)
        if value is None and isinstance(old, int) and not isinstance(old, bool) and old >= 1:
            value = old
        bounds.append(value)
    low, high = bounds
    if low is not None and high is not None and low > high:
        problems.append(f"it states at least {low} nodes and at most {high}: no job can satisfy both")
    return RuntimeInfo(
        framework=framework,
        replicated_jobs=tuple(names),
        trainer_jobs=tuple(trainer),
        node_jobs=tuple(node_jobs),
        min_nodes=low,
        max_nodes=high,
        problems=tuple(problems),
    )


def check_runtime(
    runtime: Mapping[str, Any], spec: JobSpec | None = None, *, kind: str | None = None
) -> list[str]:
    """Every reason (prefixed with the runtime's kind and name) why ``runtime`` cannot run ``spec``
    under the adapter's rules; empty when it can. Without a spec only the job-independent rules apply."""
    info = inspect_runtime(runtime)
    reasons = list(info.problems)
    actual = runtime.get("kind")
    if kind is not None and isinstance(actual, str) and actual != kind:
        reasons.insert(0, f"it is a {actual}, not a {kind}")
    if spec is not None:
        if spec.procs_per_node is not None and info.framework != "torch":
            reasons.append(
                f"procsPerNode ({spec.procs_per_node}) needs a torch runtime (mlPolicy.torch); this runtime's policy is "
                f"{info.framework or 'none'}: leave procsPerNode unset and let the runtime decide"
            )
        if info.min_nodes is not None and spec.nodes < info.min_nodes:
            reasons.append(f"nodes ({spec.nodes}) is below the runtime's minimum of {info.min_nodes}")
        if info.max_nodes is not None and spec.nodes > info.max_nodes:
            reasons.append(f"nodes ({spec.nodes}) is above the runtime's maximum of {info.max_nodes}")
    where = describe(runtime, kind)
    return [f"{where}: {r}" for r in reasons]


def reserved_env(framework: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``(prefixes, names)`` of the environment variables the Trainer injects for ``framework``."""
    if framework is None:
        return (), ()
    return _RESERVED_PREFIXES.get(framework, ()), _RESERVED_NAMES.get(framework, ())
