"""The JSON types of the fields kubesim's controllers read, per kind, checked on every create and update.

A real API server decodes built-in kinds into typed structs and validates custom resources against their
CRD schemas, so a wrongly typed field never reaches a controller. kubesim stores bodies as given, so it
checks the shapes its own code relies on instead: a wrong type is a 422 ``FieldValueTypeInvalid`` cause
naming the field, never a 500 from a crash or a controller that stops making progress.
"""

from __future__ import annotations

from typing import Any

from kubesim.errors import Cause
from kubesim.jsontypes import (
    BOOLEAN,
    INTEGER,
    STRING,
    STRING_MAP,
    Schema,
    array_of,
    object_of,
    type_causes,
)
from kubesim.resources import (
    CLUSTERQUEUES,
    CLUSTERTRAININGRUNTIMES,
    JOBS,
    LOCALQUEUES,
    NODES,
    PODS,
    RESOURCEFLAVORS,
    TRAININGRUNTIMES,
    WORKLOADPRIORITYCLASSES,
    WORKLOADS,
    ResourceType,
)

__all__ = ["JOB_TEMPLATE", "MAX_INDEXED_PARALLELISM", "METADATA", "REPLICATED_JOBS", "shape_causes"]

# A Kubernetes quantity is a string or a number.
_QUANTITY: Schema = {"type": "quantity"}
_QUANTITY_MAP: Schema = {"type": "object", "values": _QUANTITY}
_RESOURCES = object_of(limits=_QUANTITY_MAP, requests=_QUANTITY_MAP)
_ENV = array_of(object_of(name=STRING, value=STRING, valueFrom=object_of()))
_CONTAINER = object_of(
    name=STRING,
    image=STRING,
    command=array_of(STRING),
    args=array_of(STRING),
    env=_ENV,
    resources=_RESOURCES,
    ports=array_of(object_of(containerPort=INTEGER)),
)
_TOLERATIONS = array_of(
    object_of(key=STRING, operator=STRING, value=STRING, effect=STRING, tolerationSeconds=INTEGER)
)
_POD_SPEC = object_of(
    containers=array_of(_CONTAINER),
    initContainers=array_of(_CONTAINER),
    restartPolicy=STRING,
    nodeName=STRING,
    nodeSelector=STRING_MAP,
    affinity=object_of(),
    tolerations=_TOLERATIONS,
    schedulingGates=array_of(object_of(name=STRING)),
    terminationGracePeriodSeconds=INTEGER,
    activeDeadlineSeconds=INTEGER,
    priority=INTEGER,
    hostname=STRING,
    subdomain=STRING,
)
METADATA = object_of(labels=STRING_MAP, annotations=STRING_MAP)
_POD_TEMPLATE = object_of(metadata=METADATA, spec=_POD_SPEC)
JOB_TEMPLATE = object_of(
    metadata=METADATA,
    spec=object_of(
        parallelism=INTEGER,
        completions=INTEGER,
        backoffLimit=INTEGER,
        completionMode=STRING,
        template=_POD_TEMPLATE,
    ),
)
REPLICATED_JOBS = array_of(
    object_of(
        name=STRING,
        groupName=STRING,
        replicas=INTEGER,
        template=JOB_TEMPLATE,
        dependsOn=array_of(object_of(name=STRING, status=STRING)),
    )
)
_RUNTIME_SPEC = object_of(
    mlPolicy=object_of(
        numNodes=INTEGER,
        torch=object_of(),
        mpi=object_of(numProcPerNode=INTEGER, runLauncherAsNode=BOOLEAN, sshAuthMountPath=STRING),
        jax=object_of(),
        xgboost=object_of(),
        flux=object_of(numProcPerNode=INTEGER),
    ),
    podGroupPolicy=object_of(),
    template=object_of(
        metadata=METADATA,
        spec=object_of(
            replicatedJobs=REPLICATED_JOBS,
            network=object_of(),
            successPolicy=object_of(operator=STRING, targetReplicatedJobs=array_of(STRING)),
            failurePolicy=object_of(maxRestarts=INTEGER, rules=array_of(object_of())),
        ),
    ),
)
_FLAVOR_QUOTAS = object_of(
    name=STRING,
    resources=array_of(
        object_of(name=STRING, nominalQuota=_QUANTITY, borrowingLimit=_QUANTITY, lendingLimit=_QUANTITY)
    ),
)

# batch/v1 validation caps an Indexed Job's parallelism (it bounds .status.completedIndexes).
MAX_INDEXED_PARALLELISM = 100_000

_SHAPES: dict[ResourceType, Schema] = {
    PODS: object_of(spec=_POD_SPEC),
    JOBS: object_of(spec=JOB_TEMPLATE["properties"]["spec"]),
    NODES: object_of(
        spec=object_of(
            unschedulable=BOOLEAN, taints=array_of(object_of(key=STRING, value=STRING, effect=STRING))
        ),
        status=object_of(
            capacity=_QUANTITY_MAP,
            allocatable=_QUANTITY_MAP,
            conditions=array_of(object_of(type=STRING, status=STRING, reason=STRING, message=STRING)),
        ),
    ),
    TRAININGRUNTIMES: object_of(spec=_RUNTIME_SPEC),
    CLUSTERTRAININGRUNTIMES: object_of(spec=_RUNTIME_SPEC),
    WORKLOADS: object_of(
        spec=object_of(
            queueName=STRING,
            priority=INTEGER,
            priorityClassName=STRING,
            active=BOOLEAN,
            podSets=array_of(object_of(name=STRING, count=INTEGER, minCount=INTEGER, template=_POD_TEMPLATE)),
        )
    ),
    LOCALQUEUES: object_of(spec=object_of(clusterQueue=STRING, stopPolicy=STRING)),
    CLUSTERQUEUES: object_of(
        spec=object_of(
            cohort=STRING,
            cohortName=STRING,
            namespaceSelector=object_of(matchLabels=STRING_MAP, matchExpressions=array_of(object_of())),
            queueingStrategy=STRING,
            stopPolicy=STRING,
            preemption=object_of(
                withinClusterQueue=STRING, reclaimWithinCohort=STRING, borrowWithinCohort=object_of()
            ),
            admissionChecks=array_of(STRING),
            admissionChecksStrategy=object_of(),
            resourceGroups=array_of(
                object_of(coveredResources=array_of(STRING), flavors=array_of(_FLAVOR_QUOTAS))
            ),
        )
    ),
    RESOURCEFLAVORS: object_of(spec=object_of(nodeLabels=STRING_MAP, tolerations=_TOLERATIONS)),
    WORKLOADPRIORITYCLASSES: object_of(value=INTEGER),
}


def shape_causes(rt: ResourceType, obj: dict[str, Any]) -> list[Cause]:
    """Wrongly typed fields of ``obj`` among those kubesim reads for its kind (none for other kinds)."""
    schema = _SHAPES.get(rt)
    if schema is None:
        return []
    causes: list[Cause] = []
    for field, sub in schema["properties"].items():
        causes += type_causes(obj.get(field), sub, field)
    if rt is PODS and not causes and not (obj.get("spec") or {}).get("containers"):
        causes.append(Cause.required("spec.containers"))
    if rt is JOBS and not causes:
        spec = obj.get("spec") or {}
        parallelism = spec.get("parallelism")
        if spec.get("completionMode") == "Indexed":
            if spec.get("completions") is None:
                causes.append(Cause.required("spec.completions", "when completion mode is Indexed"))
            if parallelism is not None and parallelism > MAX_INDEXED_PARALLELISM:
                causes.append(
                    Cause.invalid_value(
                        "spec.parallelism",
                        parallelism,
                        f"must be less than or equal to {MAX_INDEXED_PARALLELISM} when completion mode is Indexed",
                    )
                )
    return causes
