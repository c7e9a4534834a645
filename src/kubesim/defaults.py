"""What the apiserver adds to a built-in object on create: API defaults and the create strategies.

- Pods: the core/v1 defaults (``pkg/apis/core/v1/defaults.go``: ``SetDefaults_PodSpec``,
  ``SetDefaults_Container``, ``SetDefaults_ContainerPort``, ...) and, from the pod strategy's
  ``PrepareForCreate``, the ``PodScheduled=False/SchedulingGated`` condition of a gated pod.
- Jobs: the Job strategy's ``generateSelector`` (``pkg/registry/batch/job/strategy.go``): unless
  ``spec.manualSelector`` is true, the template gets the ``job-name``/``controller-uid`` labels (legacy and
  ``batch.kubernetes.io/`` forms) and ``spec.selector`` matches the job's uid, so ``kubectl logs job/x``
  and ``describe`` select this job's pods and no other's.

Everything here runs for API requests and controller writes alike, as on a real server.
"""

from __future__ import annotations

from typing import Any

from kubesim.clock import rfc3339
from kubesim.errors import Cause, invalid
from kubesim.resources import PODS

__all__ = ["GATED_MESSAGE", "default_job", "default_pod", "ephemeral_containers"]

GATED_MESSAGE = "Scheduling is blocked due to non-empty scheduling gates"
LEGACY_JOB_NAME, JOB_NAME = "job-name", "batch.kubernetes.io/job-name"
LEGACY_CONTROLLER_UID, CONTROLLER_UID = "controller-uid", "batch.kubernetes.io/controller-uid"


def _image_pull_policy(image: Any) -> str:
    """``Always`` for an untagged or ``:latest`` image, else ``IfNotPresent`` (a digest counts as a tag)."""
    if not isinstance(image, str):
        return "IfNotPresent"
    if "@" in image:
        return "IfNotPresent"
    last = image.rsplit("/", 1)[-1]
    tag = last.split(":", 1)[1] if ":" in last else ""
    return "Always" if tag in ("", "latest") else "IfNotPresent"


def _default_container(c: Any) -> None:
    if not isinstance(c, dict):
        return
    c.setdefault("terminationMessagePath", "/dev/termination-log")
    c.setdefault("terminationMessagePolicy", "File")
    c.setdefault("imagePullPolicy", _image_pull_policy(c.get("image")))
    if not isinstance(c.get("resources"), dict):
        c["resources"] = {}
    for port in c.get("ports") or []:
        if isinstance(port, dict):
            port.setdefault("protocol", "TCP")
    for env in c.get("env") or []:
        field_ref = (env.get("valueFrom") or {}).get("fieldRef") if isinstance(env, dict) else None
        if isinstance(field_ref, dict):
            field_ref.setdefault("apiVersion", "v1")


def default_pod(pod: dict[str, Any], now: float) -> None:
    """Apply the core API's pod defaults in place (fields the client set are kept)."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("securityContext", {})
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("enableServiceLinks", True)
    for key in ("containers", "initContainers"):
        for c in spec.get(key) or []:
            _default_container(c)
    if spec.get("schedulingGates"):
        status = pod.setdefault("status", {})
        conditions = status.setdefault("conditions", [])
        if not any(isinstance(c, dict) and c.get("type") == "PodScheduled" for c in conditions):
            conditions.append(
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "SchedulingGated",
                    "message": GATED_MESSAGE,
                    "lastProbeTime": None,
                    "lastTransitionTime": rfc3339(now),
                }
            )


def default_job(job: dict[str, Any]) -> None:
    """The Job strategy's generated selector and template labels (in place; the uid must be set).

    As upstream, a job without labels of its own takes its template's labels (defaulting), which then
    include the generated ones only when the template had labels at all."""
    meta = job.get("metadata") or {}
    spec = job.get("spec")
    if not isinstance(spec, dict) or spec.get("manualSelector") is True:
        return
    template = spec.get("template")
    if not isinstance(template, dict):
        return
    tmeta = template.setdefault("metadata", {})
    if not isinstance(tmeta, dict):
        return
    labels = tmeta.get("labels")
    had_labels = labels is not None
    if labels is None:
        labels = tmeta["labels"] = {}
    if not isinstance(labels, dict):
        return
    uid, name = meta.get("uid", ""), meta.get("name", "")
    for key in (LEGACY_JOB_NAME, JOB_NAME):
        labels.setdefault(key, name)
    for key in (LEGACY_CONTROLLER_UID, CONTROLLER_UID):
        labels.setdefault(key, uid)
    selector = spec.get("selector")
    if not isinstance(selector, dict):
        selector = spec["selector"] = {}
    match = selector.setdefault("matchLabels", {})
    if isinstance(match, dict):
        match.setdefault(CONTROLLER_UID, uid)
    # SetDefaults_Job runs first: a job without labels shares its template's label map (the Go map is the
    # same object, so it also sees the generated labels) — only when the template had labels.
    if had_labels and not meta.get("labels"):
        meta["labels"] = dict(labels)


def ephemeral_containers(pod_name: str, existing: Any, spec: Any) -> list[Any]:
    """The ``spec.ephemeralContainers`` an update of ``pods/<name>/ephemeralcontainers`` leaves (what
    ``kubectl debug`` patches): new ones are added, with the container defaults; existing ones may not be
    changed or removed (422, as ``ValidatePodEphemeralContainersUpdate``)."""
    old = [c for c in existing or [] if isinstance(c, dict)]
    wanted = (spec or {}).get("ephemeralContainers") if isinstance(spec, dict) else None
    if not isinstance(wanted, list):
        wanted = []
    by_name = {c.get("name"): c for c in wanted if isinstance(c, dict)}
    causes = []
    for i, c in enumerate(old):
        if by_name.get(c.get("name")) != c:
            causes.append(
                Cause.forbidden(
                    f"spec.ephemeralContainers[{i}]",
                    f"existing ephemeral containers {c.get('name')!r} may not be changed",
                )
            )
    if causes:
        raise invalid(PODS, pod_name, causes)
    out = list(old)
    names = {c.get("name") for c in old}
    for c in wanted:
        if isinstance(c, dict) and c.get("name") not in names:
            c = dict(c)
            _default_container(c)
            out.append(c)
    return out
