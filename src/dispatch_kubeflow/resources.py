"""Every Kubernetes resource the adapter reads or writes, as typed REST paths (pure).

The adapter never spells a URL by hand: it names a :class:`Resource` here and asks it for a path, so the
group, version, plural and scope of each kind live in one place.
"""

from __future__ import annotations

from typing import Final

from msgspec import Struct

from dispatch_kubeflow.names import (
    JOBSET_GROUP,
    JOBSET_VERSION,
    KUEUE_GROUP,
    KUEUE_VERSION,
    TRAINER_GROUP,
    TRAINER_VERSION,
)

__all__ = [
    "ADMISSION_CHECKS",
    "CLUSTER_QUEUES",
    "CLUSTER_TRAINING_RUNTIMES",
    "CRDS",
    "EVENTS",
    "JOBS",
    "JOBSETS",
    "LEASES",
    "LOCAL_QUEUES",
    "NAMESPACES",
    "NODES",
    "PODS",
    "SELF_SUBJECT_ACCESS_REVIEWS",
    "TRAINING_RUNTIMES",
    "TRAINJOBS",
    "WORKLOADS",
    "WORKLOAD_PRIORITY_CLASSES",
    "Resource",
    "group_version_path",
]


class Resource(Struct, frozen=True):
    """One served resource: API group ("" for core), version, plural, kind and scope."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """The REST path of the collection (no ``name``), an object, or one of its subresources. A namespaced
        resource without ``namespace`` is the all-namespaces collection."""
        parts = [group_version_path(self.group, self.version).lstrip("/")]
        if self.namespaced and namespace is not None:
            parts += ["namespaces", _segment(namespace)]
        parts.append(self.plural)
        if name is not None:
            parts.append(_segment(name))
        if subresource is not None:
            parts.append(subresource)
        return "/" + "/".join(parts)


def _segment(text: str) -> str:
    """``text`` as one path segment: RFC 3986 unreserved characters as they are, the rest percent-encoded
    (Kubernetes names never need it; a malformed one must not change the path's shape)."""
    return "".join(
        c if c.isascii() and (c.isalnum() or c in "-._~") else "".join(f"%{b:02X}" for b in c.encode())
        for c in text
    )


def group_version_path(group: str, version: str) -> str:
    """``/api/v1`` for the core group, else ``/apis/<group>/<version>`` (the discovery document's path)."""
    return f"/apis/{group}/{version}" if group else f"/api/{version}"


TRAINJOBS: Final = Resource(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", "TrainJob", True)
TRAINING_RUNTIMES: Final = Resource(
    TRAINER_GROUP, TRAINER_VERSION, "trainingruntimes", "TrainingRuntime", True
)
CLUSTER_TRAINING_RUNTIMES: Final = Resource(
    TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", "ClusterTrainingRuntime", False
)
JOBSETS: Final = Resource(JOBSET_GROUP, JOBSET_VERSION, "jobsets", "JobSet", True)
JOBS: Final = Resource("batch", "v1", "jobs", "Job", True)
PODS: Final = Resource("", "v1", "pods", "Pod", True)
NODES: Final = Resource("", "v1", "nodes", "Node", False)
NAMESPACES: Final = Resource("", "v1", "namespaces", "Namespace", False)
EVENTS: Final = Resource("", "v1", "events", "Event", True)
WORKLOADS: Final = Resource(KUEUE_GROUP, KUEUE_VERSION, "workloads", "Workload", True)
LABEL_JOB_UID: Final = "kueue.x-k8s.io/job-uid"
"""The label Kueue sets on a Workload: the UID of the job (TrainJob) it admits."""
LOCAL_QUEUES: Final = Resource(KUEUE_GROUP, KUEUE_VERSION, "localqueues", "LocalQueue", True)
WORKLOAD_PRIORITY_CLASSES: Final = Resource(
    KUEUE_GROUP, KUEUE_VERSION, "workloadpriorityclasses", "WorkloadPriorityClass", False
)
ADMISSION_CHECKS: Final = Resource(KUEUE_GROUP, KUEUE_VERSION, "admissionchecks", "AdmissionCheck", False)
CLUSTER_QUEUES: Final = Resource(KUEUE_GROUP, KUEUE_VERSION, "clusterqueues", "ClusterQueue", False)
LEASES: Final = Resource("coordination.k8s.io", "v1", "leases", "Lease", True)
"""``dispatch-admission``'s leader-election Lease."""
SELF_SUBJECT_ACCESS_REVIEWS: Final = Resource(
    "authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview", False
)
CRDS: Final = Resource(
    "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False
)
