"""Reading incarnations off the cluster into :class:`~dispatch_kubeflow.causes.Snapshot`s.

``observe`` reads one incarnation (its TrainJob, the JobSet of the same name, that JobSet's Jobs, its pods
and, with Kueue, its Workload: five requests); ``list`` reads every incarnation with one list per kind,
never one request per job. Objects the credentials may not read are left out (the cause table then works
from what it has). A TrainJob that answers 404 is confirmed gone by a second read before it is reported
lost (:func:`confirm_gone`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dispatch.errors import NotFoundError, PermissionDeniedError, UnavailableError
from dispatch_kubeflow.kube import KubeClient
from dispatch_kubeflow.names import LABEL_INCARNATION, LABEL_JOB_HASH, LABEL_JOBSET_NAME
from dispatch_kubeflow.resources import JOBS, JOBSETS, PODS, TRAINJOBS, WORKLOADS

__all__ = ["LABEL_JOB_UID", "Parts", "confirm_gone", "read_all", "read_one"]

LABEL_JOB_UID = "kueue.x-k8s.io/job-uid"
"""Kueue labels a Workload with the UID of the job it stands for."""


@dataclass(slots=True)
class Parts:
    """The objects of one incarnation besides its TrainJob."""

    jobset: dict[str, Any] | None = None
    jobs: list[dict[str, Any]] = field(default_factory=list)
    pods: list[dict[str, Any]] = field(default_factory=list)
    workload: dict[str, Any] | None = None


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    labels = _meta(obj).get("labels")
    return labels if isinstance(labels, Mapping) else {}


def _owner_uids(obj: Mapping[str, Any]) -> set[str]:
    refs = _meta(obj).get("ownerReferences")
    return (
        {str(r.get("uid")) for r in refs if isinstance(r, Mapping) and r.get("uid")}
        if isinstance(refs, list)
        else set()
    )


def _owned_by(obj: Mapping[str, Any] | None, uid: str) -> bool:
    """Whether ``obj`` belongs to the TrainJob ``uid`` (objects without owner references are trusted by
    name, as a cluster without a garbage collector may leave them bare)."""
    if obj is None:
        return False
    owners = _owner_uids(obj)
    return not owners or not uid or uid in owners


async def _readable_list(
    client: KubeClient, path: str, *, what: str, label_selector: str | None = None
) -> list[dict[str, Any]]:
    try:
        return await client.list(path, what=what, label_selector=label_selector)
    except (PermissionDeniedError, NotFoundError):
        return []  # not readable with these credentials (or not served): classify without them


async def read_one(client: KubeClient, namespace: str, trainjob: Mapping[str, Any], *, kueue: bool) -> Parts:
    """The JobSet, Jobs, pods and Workload of one TrainJob."""
    name = str(_meta(trainjob).get("name", ""))
    uid = str(_meta(trainjob).get("uid", ""))
    labels = _labels(trainjob)
    parts = Parts()
    try:
        js = await client.get_or_none(JOBSETS.path(namespace, name), what=f'get JobSet "{name}"')
        parts.jobset = js if _owned_by(js, uid) else None
    except PermissionDeniedError:
        pass
    parts.jobs = await _readable_list(
        client,
        JOBS.path(namespace),
        what=f'list the Jobs of JobSet "{name}"',
        label_selector=f"{LABEL_JOBSET_NAME}={name}",
    )
    selector = f"{LABEL_JOB_HASH}={labels.get(LABEL_JOB_HASH, '')},{LABEL_INCARNATION}={labels.get(LABEL_INCARNATION, '')}"
    parts.pods = await _readable_list(
        client, PODS.path(namespace), what=f'list the pods of TrainJob "{name}"', label_selector=selector
    )
    if kueue and uid:
        workloads = await _readable_list(
            client,
            WORKLOADS.path(namespace),
            what=f'list the Workload of TrainJob "{name}"',
            label_selector=f"{LABEL_JOB_UID}={uid}",
        )
        parts.workload = workloads[0] if workloads else None
    return parts


async def read_all(
    client: KubeClient, namespace: str, trainjobs: list[dict[str, Any]], *, kueue: bool, pod_selector: str
) -> dict[str, Parts]:
    """The parts of every TrainJob in ``trainjobs``, keyed by TrainJob name: one list request per kind."""
    by_name = {str(_meta(t).get("name", "")): t for t in trainjobs}
    out = {name: Parts() for name in by_name}
    if not trainjobs:
        return out
    for js in await _readable_list(client, JOBSETS.path(namespace), what="list JobSets"):
        name = str(_meta(js).get("name", ""))
        if name in out and _owned_by(js, str(_meta(by_name[name]).get("uid", ""))):
            out[name].jobset = js
    for job in await _readable_list(
        client, JOBS.path(namespace), what="list Jobs", label_selector=LABEL_JOBSET_NAME
    ):
        name = str(_labels(job).get(LABEL_JOBSET_NAME, ""))
        if name in out:
            out[name].jobs.append(job)
    pods_by_key: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for pod in await _readable_list(
        client, PODS.path(namespace), what="list pods", label_selector=pod_selector
    ):
        labels = _labels(pod)
        pods_by_key[(str(labels.get(LABEL_JOB_HASH, "")), str(labels.get(LABEL_INCARNATION, "")))].append(pod)
    for name, tj in by_name.items():
        labels = _labels(tj)
        out[name].pods = pods_by_key.get(
            (str(labels.get(LABEL_JOB_HASH, "")), str(labels.get(LABEL_INCARNATION, ""))), []
        )
    if kueue:
        by_uid = {str(_meta(t).get("uid", "")): name for name, t in by_name.items()}
        for wl in await _readable_list(
            client, WORKLOADS.path(namespace), what="list Workloads", label_selector=LABEL_JOB_UID
        ):
            name = by_uid.get(str(_labels(wl).get(LABEL_JOB_UID, "")), "")
            if name:
                out[name].workload = wl
    return out


async def confirm_gone(client: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    """After a 404 on ``name``: a second, differently routed read — a list of TrainJobs selecting that name —
    that must answer as a served collection. Returns the TrainJob if it is there after all, ``None`` if it is
    confirmed gone; a collection that is not served (the CRD is being reinstalled, a proxy misroutes) is
    an ``UnavailableError``, not a lost job."""
    what = f'confirm that TrainJob "{name}" is gone'
    try:
        found = await client.request(
            "GET", TRAINJOBS.path(namespace), what=what, params={"fieldSelector": f"metadata.name={name}"}
        )
    except NotFoundError:
        raise UnavailableError(
            f"{what}: the API server does not serve TrainJobs right now (404 on the collection); not calling "
            "the job lost — try again"
        ) from None
    items = found.get("items") if isinstance(found, dict) else None
    if not isinstance(items, list) or str(found.get("kind", "")) not in ("TrainJobList", ""):
        raise UnavailableError(
            f"{what}: the answer is not a list of TrainJobs; not calling the job lost — try again"
        )
    for item in items:
        if isinstance(item, dict) and _meta(item).get("name") == name:
            return item
    return None
