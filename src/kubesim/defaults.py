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

import random
from typing import Any

from kubesim.clock import rfc3339
from kubesim.errors import Cause, invalid
from kubesim.resources import PODS

__all__ = [
    "API_ACCESS_MOUNT_PATH",
    "API_ACCESS_PREFIX",
    "GATED_MESSAGE",
    "default_deployment",
    "default_job",
    "default_pod",
    "default_pod_spec",
    "ephemeral_containers",
    "job_restart_policy_causes",
]

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


def default_pod_spec(spec: Any) -> None:
    """``SetDefaults_PodSpec`` and the container defaults, in place: what a pod, and the pod template of
    a Job or Deployment, gets from the core/v1 defaulting."""
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


def default_pod(pod: dict[str, Any], now: float) -> None:
    """Apply the core API's pod defaults and the default admission plugins' mutations in place (fields
    the client set are kept). ``now``: the wall-clock time of the create."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return
    default_pod_spec(spec)
    _admit_pod(spec)
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


API_ACCESS_PREFIX = "kube-api-access-"
API_ACCESS_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
_NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apiserver's names.SimpleNameGenerator


def _admit_pod(spec: dict[str, Any]) -> None:
    """The pod mutations of kube-apiserver's default admission plugins:

    - ``Priority`` (``plugin/pkg/admission/priority``): no ``priorityClassName`` and no global default
      class → ``priority: 0``, ``preemptionPolicy: PreemptLowerPriority``;
    - ``ServiceAccount`` (``plugin/pkg/admission/serviceaccount/admission.go``): ``serviceAccountName:
      default`` (and the deprecated ``serviceAccount`` the v1 conversion copies), and unless
      ``automountServiceAccountToken: false`` the ``kube-api-access-xxxxx`` projected volume (token,
      ``kube-root-ca.crt``, namespace) mounted read-only in every container at
      ``/var/run/secrets/kubernetes.io/serviceaccount``."""
    if not spec.get("priorityClassName"):
        spec.setdefault("priority", 0)
        spec.setdefault("preemptionPolicy", "PreemptLowerPriority")
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec.setdefault("serviceAccount", spec["serviceAccountName"])
    if spec.get("automountServiceAccountToken") is False:
        return
    volumes = spec.get("volumes")
    if volumes is not None and not isinstance(volumes, list):
        return
    existing = [v.get("name") for v in volumes or [] if isinstance(v, dict)]
    name = next((n for n in existing if isinstance(n, str) and n.startswith(API_ACCESS_PREFIX)), None)
    has_volume = name is not None
    if name is None:
        # The API server's suffix is random per pod; one drawn from a fixed seed serves as well (the name is
        # the pod's own) and never touches the process's global generator (a seeded simulation replays).
        draw = random.Random(0x5EED)
        name = API_ACCESS_PREFIX + "".join(draw.choice(_NAME_ALPHABET) for _ in range(5))
    needs_volume = False
    for key in ("initContainers", "containers"):
        for c in spec.get(key) or []:
            if not isinstance(c, dict) or not isinstance(c.get("volumeMounts", []), list):
                continue
            mounts = c.setdefault("volumeMounts", [])
            if any(isinstance(m, dict) and m.get("mountPath") == API_ACCESS_MOUNT_PATH for m in mounts):
                continue
            mounts.append({"name": name, "readOnly": True, "mountPath": API_ACCESS_MOUNT_PATH})
            needs_volume = True
    if needs_volume and not has_volume:
        spec.setdefault("volumes", []).append({"name": name, "projected": _api_access_source()})


def _api_access_source() -> dict[str, Any]:
    """``TokenVolumeSource()``: the bound token (3607 s, the warn-only expiry), the cluster CA, the
    namespace; ``defaultMode`` 420 (0644) written out, as the plugin does."""
    return {
        "defaultMode": 420,
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {
                "downwardAPI": {
                    "items": [
                        {
                            "path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                        }
                    ]
                }
            },
        ],
    }


def default_job(job: dict[str, Any]) -> None:
    """The Job strategy's generated selector and template labels (in place; the uid must be set).

    As upstream, a job without labels of its own takes its template's labels (defaulting), which then
    include the generated ones only when the template had labels at all."""
    meta = job.get("metadata") or {}
    spec = job.get("spec")
    if not isinstance(spec, dict):
        return
    _set_job_defaults(spec)
    default_pod_spec(
        (spec.get("template") or {}).get("spec") if isinstance(spec.get("template"), dict) else None
    )
    if spec.get("manualSelector") is True:
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


def _set_job_defaults(spec: dict[str, Any]) -> None:
    """``SetDefaults_Job`` (``pkg/apis/batch/v1/defaults.go``) on a JobSpec, in place."""
    if spec.get("completions") is None and spec.get("parallelism") is None:
        spec["completions"] = 1
    spec.setdefault("parallelism", 1)
    if spec.get("backoffLimit") is None:
        spec["backoffLimit"] = 2_147_483_647 if spec.get("backoffLimitPerIndex") is not None else 6
    spec.setdefault("completionMode", "NonIndexed")
    spec.setdefault("suspend", False)
    policy = spec.get("podFailurePolicy")
    for rule in (policy.get("rules") or []) if isinstance(policy, dict) else []:
        for pattern in (rule.get("onPodConditions") or []) if isinstance(rule, dict) else []:
            if isinstance(pattern, dict) and not pattern.get("status"):
                pattern["status"] = "True"
    spec.setdefault("podReplacementPolicy", "Failed" if policy is not None else "TerminatingOrFailed")
    spec.setdefault("manualSelector", False)


def default_deployment(deployment: dict[str, Any]) -> None:
    """``SetDefaults_Deployment`` (``pkg/apis/apps/v1/defaults.go``) and the template's pod defaults."""
    spec = deployment.get("spec")
    if not isinstance(spec, dict):
        return
    spec.setdefault("replicas", 1)
    strategy = spec.setdefault("strategy", {})
    if isinstance(strategy, dict):
        strategy.setdefault("type", "RollingUpdate")
        if strategy["type"] == "RollingUpdate":
            rolling = strategy.setdefault("rollingUpdate", {})
            if isinstance(rolling, dict):
                rolling.setdefault("maxUnavailable", "25%")
                rolling.setdefault("maxSurge", "25%")
    spec.setdefault("revisionHistoryLimit", 10)
    spec.setdefault("progressDeadlineSeconds", 600)
    template = spec.get("template")
    default_pod_spec(template.get("spec") if isinstance(template, dict) else None)


def job_restart_policy_causes(job: dict[str, Any]) -> list[Cause]:
    """``ValidateJobSpec``: a Job's pods restart ``OnFailure`` or ``Never`` (an unset policy was defaulted
    to ``Always``, which is refused)."""
    tspec = ((job.get("spec") or {}).get("template") or {}).get("spec")
    if not isinstance(tspec, dict):
        return []
    policy = tspec.get("restartPolicy") or "Always"
    if policy in ("OnFailure", "Never"):
        return []
    return [Cause.not_supported("spec.template.spec.restartPolicy", policy, ["OnFailure", "Never"])]


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
