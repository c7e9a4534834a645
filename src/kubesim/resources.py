"""The resource types kubesim serves: group/version/kind/plural, scope, subresources and short names.

One registry drives the store, discovery and the HTTP routes, so adding a type is one line here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "ADMISSIONCHECKS",
    "CLUSTERQUEUES",
    "CLUSTERTRAININGRUNTIMES",
    "CONFIGMAPS",
    "CUSTOMRESOURCEDEFINITIONS",
    "EVENTS",
    "EVENTS_V1",
    "JOBS",
    "JOBSETS",
    "LEASES",
    "LOCALQUEUES",
    "NAMESPACES",
    "NODES",
    "PERSISTENTVOLUMECLAIMS",
    "PERSISTENTVOLUMES",
    "PODS",
    "REGISTRY",
    "RESOURCEFLAVORS",
    "SECRETS",
    "SELFSUBJECTACCESSREVIEWS",
    "SELFSUBJECTREVIEWS",
    "SELFSUBJECTRULESREVIEWS",
    "SERVICES",
    "STORAGECLASSES",
    "TRAININGRUNTIMES",
    "TRAINJOBS",
    "WORKLOADPRIORITYCLASSES",
    "WORKLOADS",
    "ResourceType",
    "by_kind",
    "by_plural",
    "register",
]

_ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")


@dataclass(frozen=True)
class ResourceType:
    """A served resource: ``group`` ("" for core), ``version``, ``kind``, ``plural``, scope and subresources."""

    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool
    subresources: frozenset[str] = frozenset({"status"})
    short_names: tuple[str, ...] = ()
    verbs: tuple[str, ...] = field(default=_ALL_VERBS)
    categories: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        """``v1`` for core, else ``group/version``."""
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def qualified(self) -> str:
        """``plural.group`` (or ``plural`` for core), as error messages name a resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def __repr__(self) -> str:
        return f"ResourceType({self.api_version} {self.kind})"


REGISTRY: dict[tuple[str, str], ResourceType] = {}
_BY_KIND: dict[tuple[str, str], ResourceType] = {}


def register(rt: ResourceType) -> ResourceType:
    """Add a resource type (idempotent for an equal type)."""
    REGISTRY[(rt.group, rt.plural)] = rt
    _BY_KIND[(rt.api_version, rt.kind)] = rt
    return rt


def by_kind(api_version: str, kind: str) -> ResourceType:
    """Look a type up by ``apiVersion`` and ``kind``; KeyError-free: raises LookupError naming both."""
    rt = _BY_KIND.get((api_version, kind))
    if rt is None:
        raise LookupError(f"no resource registered for apiVersion={api_version!r} kind={kind!r}")
    return rt


def by_plural(group: str, plural: str) -> ResourceType | None:
    """The type served at ``/apis/<group>/<version>/<plural>`` (or ``/api/v1/<plural>``), or None."""
    return REGISTRY.get((group, plural))


_NOSTATUS: frozenset[str] = frozenset()
_STATUS = frozenset({"status"})

NAMESPACES = register(ResourceType("", "v1", "Namespace", "namespaces", False, _STATUS, ("ns",)))
PODS = register(
    ResourceType(
        "",
        "v1",
        "Pod",
        "pods",
        True,
        frozenset({"status", "log", "ephemeralcontainers"}),
        ("po",),
        categories=("all",),
    )
)
EVENTS = register(ResourceType("", "v1", "Event", "events", True, _NOSTATUS, ("ev",)))
# The same Events seen through events.k8s.io/v1 (one storage: kubesim.eventsv1 converts).
EVENTS_V1 = register(ResourceType("events.k8s.io", "v1", "Event", "events", True, _NOSTATUS, ("ev",)))
SERVICES = register(
    ResourceType("", "v1", "Service", "services", True, _STATUS, ("svc",), categories=("all",))
)
NODES = register(ResourceType("", "v1", "Node", "nodes", False, _STATUS, ("no",)))
CONFIGMAPS = register(ResourceType("", "v1", "ConfigMap", "configmaps", True, _NOSTATUS, ("cm",)))
SECRETS = register(ResourceType("", "v1", "Secret", "secrets", True, _NOSTATUS))
JOBS = register(ResourceType("batch", "v1", "Job", "jobs", True, _STATUS, categories=("all",)))
JOBSETS = register(ResourceType("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets", True, _STATUS))
TRAINJOBS = register(ResourceType("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs", True, _STATUS))
TRAININGRUNTIMES = register(
    ResourceType("trainer.kubeflow.org", "v1alpha1", "TrainingRuntime", "trainingruntimes", True, _NOSTATUS)
)
CLUSTERTRAININGRUNTIMES = register(
    ResourceType(
        "trainer.kubeflow.org",
        "v1alpha1",
        "ClusterTrainingRuntime",
        "clustertrainingruntimes",
        False,
        _NOSTATUS,
    )
)
WORKLOADS = register(
    ResourceType(
        "kueue.x-k8s.io",
        "v1beta2",
        "Workload",
        "workloads",
        True,
        _STATUS,
        ("kwl", "kueueworkload", "kueueworkloads"),
    )
)
ADMISSIONCHECKS = register(
    ResourceType("kueue.x-k8s.io", "v1beta2", "AdmissionCheck", "admissionchecks", False, _STATUS, ("ac",))
)
LOCALQUEUES = register(
    ResourceType(
        "kueue.x-k8s.io", "v1beta2", "LocalQueue", "localqueues", True, _STATUS, ("queue", "queues", "lq")
    )
)
CLUSTERQUEUES = register(
    ResourceType("kueue.x-k8s.io", "v1beta2", "ClusterQueue", "clusterqueues", False, _STATUS, ("cq",))
)
RESOURCEFLAVORS = register(
    ResourceType(
        "kueue.x-k8s.io",
        "v1beta2",
        "ResourceFlavor",
        "resourceflavors",
        False,
        _NOSTATUS,
        ("flavor", "flavors", "rf"),
    )
)
WORKLOADPRIORITYCLASSES = register(
    ResourceType(
        "kueue.x-k8s.io", "v1beta2", "WorkloadPriorityClass", "workloadpriorityclasses", False, _NOSTATUS
    )
)
PERSISTENTVOLUMECLAIMS = register(
    ResourceType("", "v1", "PersistentVolumeClaim", "persistentvolumeclaims", True, _STATUS, ("pvc",))
)
PERSISTENTVOLUMES = register(
    ResourceType("", "v1", "PersistentVolume", "persistentvolumes", False, _STATUS, ("pv",))
)
STORAGECLASSES = register(
    ResourceType("storage.k8s.io", "v1", "StorageClass", "storageclasses", False, _NOSTATUS, ("sc",))
)
LEASES = register(ResourceType("coordination.k8s.io", "v1", "Lease", "leases", True, _NOSTATUS))
SELFSUBJECTACCESSREVIEWS = register(
    ResourceType(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectAccessReview",
        "selfsubjectaccessreviews",
        False,
        _NOSTATUS,
        verbs=("create",),
    )
)
SELFSUBJECTRULESREVIEWS = register(
    ResourceType(
        "authorization.k8s.io",
        "v1",
        "SelfSubjectRulesReview",
        "selfsubjectrulesreviews",
        False,
        _NOSTATUS,
        verbs=("create",),
    )
)
SELFSUBJECTREVIEWS = register(
    ResourceType(
        "authentication.k8s.io",
        "v1",
        "SelfSubjectReview",
        "selfsubjectreviews",
        False,
        _NOSTATUS,
        verbs=("create",),
    )
)
CUSTOMRESOURCEDEFINITIONS = register(
    ResourceType(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
        False,
        _STATUS,
        ("crd", "crds"),
    )
)
