"""How a job becomes a TrainJob (SPEC §9.5), as pure functions: checks, then the object.

Everything Trainer's webhooks or the CRD schema would refuse is refused here first, with an
:class:`~dispatch.errors.InvalidError` naming the field of the *job spec*, before any request is sent.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dispatch.errors import InvalidError, UnsupportedError
from dispatch.execlimits import check_exec
from dispatch.model import Identity, Image, JobSpec, SharedCheckpoint
from dispatch_kubeflow.extension import RuntimeRef
from dispatch_kubeflow.holds import created_token
from dispatch_kubeflow.names import (
    ANNOTATION_HOLD,
    CHECKPOINT_VOLUME,
    LABEL_PRIORITY,
    LABEL_PROBE,
    LABEL_QUEUE,
    LABEL_STORE,
    MAX_COMMAND,
    MAX_COMMAND_ITEM,
    MAX_ENV,
    MAX_IMAGE,
    MAX_NUM_NODES,
    MAX_OBJECT_BYTES,
    NODE_CONTAINER,
    PATCH_MANAGER,
    PROBE_GATE,
    TRAINER_API,
    TRAINER_GROUP,
)
from dispatch_kubeflow.naming import identity_annotations, identity_labels, native_name
from dispatch_kubeflow.runtime import RuntimeInfo, reserved_env
from dispatch_kubeflow.settings import Settings

__all__ = [
    "ACCEPTED_EXTENSIONS",
    "build_probe",
    "build_trainjob",
    "job_extensions",
    "unsupported_extensions",
]

ACCEPTED_EXTENSIONS = (Image.NAME, RuntimeRef.NAME, SharedCheckpoint.NAME)
_INT32 = 2_147_483_647
_INT64 = 9_223_372_036_854_775_807


def _ext_path(name: str, field: str | None = None) -> str:
    base = f'extensions["{name}"]'
    return f"{base}.{field}" if field else base


def job_extensions(spec: JobSpec, settings: Settings) -> tuple[Image, RuntimeRef, SharedCheckpoint | None]:
    """The extensions a job must (Image, RuntimeRef) or may (SharedCheckpoint) carry; the settings'
    ``defaultImage`` and ``defaultRuntime`` stand in for a job that names none. A missing required one is an
    :class:`InvalidError`."""
    image = spec.extensions.get(Image)
    if image is None and settings.default_image is not None:
        image = Image(settings.default_image)
    ref = spec.extensions.get(RuntimeRef)
    if ref is None:
        ref = settings.default_runtime
    missing = [
        n for n, v in ((Image.NAME, image), (RuntimeRef.NAME, ref)) if not isinstance(v, Image | RuntimeRef)
    ]
    if missing:
        defaults = {Image.NAME: "defaultImage", RuntimeRef.NAME: "defaultRuntime"}
        raise InvalidError(
            f"the kubeflow adapter needs {' and '.join(missing)} (the image to run and the Trainer runtime to "
            f"run it on), or the cluster's settings {' and '.join(defaults[n] for n in missing)}",
            path=_ext_path(missing[0]),
        )
    assert isinstance(image, Image) and isinstance(ref, RuntimeRef)
    checkpoint = spec.extensions.get(SharedCheckpoint)
    return image, ref, checkpoint if isinstance(checkpoint, SharedCheckpoint) else None


def unsupported_extensions(spec: JobSpec, settings: Settings) -> list[str]:
    """Reasons for every extension this adapter (with these settings) cannot honour."""
    reasons = [
        f"extension {name!r} is not supported by the kubeflow adapter (it accepts {', '.join(ACCEPTED_EXTENSIONS)})"
        for name in spec.extensions
        if name not in ACCEPTED_EXTENSIONS
    ]
    if SharedCheckpoint.NAME in spec.extensions and settings.checkpoint_volume is None:
        reasons.append(
            f"extension {SharedCheckpoint.NAME!r} needs a checkpoint volume: set checkpointVolume "
            "{claimName, mountPath} in the adapter settings"
        )
    return reasons


def _check_env(spec: JobSpec, framework: str | None, own: Mapping[str, str]) -> list[dict[str, str]]:
    prefixes, names = reserved_env(framework)
    for name in spec.env:
        if name.startswith(prefixes) or name in names:
            injected = ", ".join([f"{p}*" for p in prefixes] + list(names))
            raise InvalidError(
                f"the Trainer sets {injected} itself on a {framework} runtime and refuses them in a job",
                path=f'env["{name}"]',
            )
    total = len(spec.env) + len(own)
    if total > MAX_ENV:
        raise InvalidError(
            f"{len(spec.env)} entries plus dispatch's {len(own)} ({', '.join(own)}) exceed Trainer's limit of "
            f"{MAX_ENV}; at most {MAX_ENV - len(own)} are allowed",
            path="env",
        )
    return [{"name": k, "value": v} for k, v in spec.env.items()] + [
        {"name": k, "value": v} for k, v in own.items()
    ]


def _check_command(spec: JobSpec) -> list[str]:
    if len(spec.command) > MAX_COMMAND:
        raise InvalidError(
            f"{len(spec.command)} items exceed Trainer's limit of {MAX_COMMAND}", path="command"
        )
    for i, item in enumerate(spec.command):
        if len(item) > MAX_COMMAND_ITEM:
            raise InvalidError(
                f"an item may hold at most {MAX_COMMAND_ITEM} characters", path=f"command[{i}]"
            )
    return list(spec.command)


def _check_image(image: Image) -> str:
    where = _ext_path(Image.NAME, "ref")
    if len(image.ref) > MAX_IMAGE:
        raise InvalidError(f"an image reference may hold at most {MAX_IMAGE} characters", path=where)
    if image.ref != image.ref.strip():
        raise InvalidError("an image reference must not start or end with whitespace", path=where)
    return image.ref


def _checkpoint_dir(checkpoint: SharedCheckpoint, settings: Settings) -> str:
    where = _ext_path(SharedCheckpoint.NAME, "dir")
    volume = settings.checkpoint_volume
    if volume is None:  # refused earlier as unsupported; kept for a direct caller of the builder
        raise UnsupportedError(
            f"extension {SharedCheckpoint.NAME!r} needs checkpointVolume in the adapter settings"
        )
    parts = [p for p in checkpoint.dir.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise InvalidError(f"{checkpoint.dir!r}: use a plain absolute path without '.' or '..'", path=where)
    normal = "/" + "/".join(parts)
    mount = volume.mount_path
    if normal != mount and not normal.startswith(mount.rstrip("/") + "/"):
        raise InvalidError(
            f"{checkpoint.dir!r} is not under the checkpoint volume's mount path {mount!r} (settings checkpointVolume)",
            path=where,
        )
    return normal


def _pod_patch(settings: Settings, *, mount: bool, gate: bool) -> dict[str, Any]:
    pod: dict[str, Any] = {}
    if settings.service_account_name:
        pod["serviceAccountName"] = settings.service_account_name
    if settings.node_selector:
        pod["nodeSelector"] = dict(settings.node_selector)
    if settings.tolerations:
        pod["tolerations"] = [t.to_json() for t in settings.tolerations]
    if settings.image_pull_secrets:
        pod["imagePullSecrets"] = [p.to_json() for p in settings.image_pull_secrets]
    if mount and settings.checkpoint_volume is not None:
        volume = settings.checkpoint_volume
        pod["volumes"] = [
            {"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": volume.claim_name}}
        ]
        pod["containers"] = [
            {
                "name": NODE_CONTAINER,
                "volumeMounts": [{"name": CHECKPOINT_VOLUME, "mountPath": volume.mount_path}],
            }
        ]
    if gate:
        pod["schedulingGates"] = [{"name": PROBE_GATE}]
    return pod


def _runtime_patch(
    info: RuntimeInfo, settings: Settings, pod_labels: Mapping[str, str], *, checkpoint: bool, gate: bool
) -> dict[str, Any] | None:
    jobs: list[dict[str, Any]] = []
    for name in info.replicated_jobs:
        template: dict[str, Any] = {}
        if pod_labels:
            template["metadata"] = {"labels": dict(pod_labels)}
        pod = _pod_patch(settings, mount=checkpoint and name in info.node_jobs, gate=gate)
        if pod:
            template["spec"] = pod
        if template:
            job: dict[str, Any] = {"spec": {"template": template}}
            if pod_labels:  # the Jobs carry the identity too: the watch selects them by it
                job["metadata"] = {"labels": dict(pod_labels)}
            jobs.append({"name": name, "template": job})
    if not jobs:
        return None
    spec: dict[str, Any] = {"spec": {"replicatedJobs": jobs}}
    if pod_labels:  # so does the JobSet (the patch's metadata is the JobSet's)
        spec["metadata"] = {"labels": dict(pod_labels)}
    return {"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": spec}}


def _kueue_labels(settings: Settings) -> dict[str, str]:
    out: dict[str, str] = {}
    if settings.queue:
        out[LABEL_QUEUE] = settings.queue
    if settings.priority_class:
        out[LABEL_PRIORITY] = settings.priority_class
    return out


def _runtime_ref(ref: RuntimeRef) -> dict[str, str]:
    return {"apiGroup": TRAINER_GROUP, "kind": ref.kind, "name": ref.runtime}


def build_trainjob(
    spec: JobSpec,
    identity: Identity,
    settings: Settings,
    info: RuntimeInfo,
    *,
    held: bool = False,
    kueue: bool = False,
    store: str = "",
) -> dict[str, Any]:
    """The TrainJob that runs incarnation ``identity`` of ``spec`` on the runtime described by ``info``.
    ``store`` (the host's store identity, "" for none) labels it, its JobSet, Jobs and pods.

    Raises :class:`InvalidError` (naming the job spec's field) for anything Trainer would refuse.
    ``held`` puts the hold annotation (with the incarnation's created-held token) on the TrainJob and,
    without Kueue, suspends it; under Kueue (which owns ``suspend``) the admission check holds it.
    """
    image, ref, checkpoint = job_extensions(spec, settings)
    own = identity.env()
    if checkpoint is not None:
        own[SharedCheckpoint.ENV] = _checkpoint_dir(checkpoint, settings)
    if spec.nodes > MAX_NUM_NODES:
        raise InvalidError(f"at most {MAX_NUM_NODES} nodes (a 32-bit count in Trainer)", path="nodes")
    trainer: dict[str, Any] = {
        "image": _check_image(image),
        "command": _check_command(spec),
        "env": _check_env(spec, info.framework, own),
        "numNodes": spec.nodes,
    }
    check_exec(spec.command, {**spec.env, **own}, where="a Kubernetes node")  # the node container's exec
    if spec.procs_per_node is not None:
        if spec.procs_per_node > _INT32:
            raise InvalidError(f"at most {_INT32} processes per node", path="procsPerNode")
        trainer["numProcPerNode"] = spec.procs_per_node
    if settings.resources_per_node:
        trainer["resourcesPerNode"] = settings.resources_per_node.to_json()
    body: dict[str, Any] = {"runtimeRef": _runtime_ref(ref), "trainer": trainer}
    if spec.time_limit is not None:
        if spec.time_limit > _INT64:
            raise InvalidError(f"at most {_INT64} seconds (a 64-bit count in Trainer)", path="timeLimit")
        body["activeDeadlineSeconds"] = spec.time_limit
    if held and not kueue:
        body["suspend"] = True
    labels = {**identity_labels(identity), **({LABEL_STORE: store} if store else {})}
    patch = _runtime_patch(info, settings, labels, checkpoint=checkpoint is not None, gate=False)
    if patch is not None:
        body["runtimePatches"] = [patch]
    obj = {
        "apiVersion": TRAINER_API,
        "kind": "TrainJob",
        "metadata": {
            "name": native_name(identity),
            "namespace": settings.namespace,
            "labels": {**settings.labels, **_kueue_labels(settings), **labels},
            "annotations": {
                **settings.annotations,
                **identity_annotations(identity),
                **({ANNOTATION_HOLD: created_token(identity)} if held else {}),
            },
        },
        "spec": body,
    }
    size = len(json.dumps(obj))
    if size > MAX_OBJECT_BYTES:
        raise InvalidError(
            f"the TrainJob would be {size} bytes, above the API server's limit of about {MAX_OBJECT_BYTES}; "
            "shorten the command or the environment",
            path="command",
        )
    return obj


def build_probe(name: str, settings: Settings, info: RuntimeInfo) -> dict[str, Any]:
    """The preflight probe: a TrainJob on ``probeRuntime`` whose pods carry a scheduling gate, so they
    are created but never scheduled and consume nothing. It carries no dispatch identity."""
    ref = settings.probe_runtime
    body: dict[str, Any] = {"runtimeRef": _runtime_ref(ref), "trainer": {"numNodes": 1}}
    patch = _runtime_patch(info, settings, {LABEL_PROBE: "true"}, checkpoint=False, gate=True)
    if patch is not None:
        body["runtimePatches"] = [patch]
    metadata: dict[str, Any] = {
        "name": name,
        "namespace": settings.namespace,
        "labels": {**settings.labels, **_kueue_labels(settings), LABEL_PROBE: "true"},
    }
    if settings.annotations:
        metadata["annotations"] = dict(settings.annotations)
    return {"apiVersion": TRAINER_API, "kind": "TrainJob", "metadata": metadata, "spec": body}
