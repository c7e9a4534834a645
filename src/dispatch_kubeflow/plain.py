"""Whether an incarnation's reading needs more than its TrainJob and its pods (pure).

A command that asks once (``dispatch status``, ``list``) reads the TrainJobs and pods first; the JobSets,
Jobs and Kueue Workloads only when some incarnation it reads is not :func:`plain`. A plain incarnation is
one whose outcome the cause table reads from its TrainJob and pods alone:

- its TrainJob is not being deleted, not suspended (held, queued), carries no Kueue queue label (Kueue
  makes a Workload only for those: ``manageJobsWithoutQueueName`` is off by default), and has no
  ``Failed`` condition (a failure's evidence names the Job's condition, and a failure whose pods are gone
  reads the Workload and the JobSet);
- it is ``Complete``, or every node has its pod and none of its pods failed, is being deleted, was
  disrupted, or has a container that terminated with a non-zero code or restarted (what the JobSet and Job
  conditions would add to; a node whose pod is gone may be what a Job's ``Failed`` is about).

What remains is the time between a Job's ``FailureTarget`` and its pods showing it — a reconcile on a real
cluster, the lag any watch of the Jobs has too. JobSet restarts (evidence on a running job) are not read
for a plain incarnation: the adapter refuses runtimes whose JobSet restarts on its own (SPEC §9.4).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dispatch_kubeflow.names import LABEL_QUEUE, NODE_CONTAINER
from dispatch_kubeflow.objects import as_map, labels_of, meta_of
from dispatch_kubeflow.output import LABEL_INDEX

__all__ = ["FIRST", "plain"]

FIRST = frozenset({"trainjobs", "pods"})
"""The kinds read first; the others only for an incarnation that is not plain."""


def _true(obj: Mapping[str, Any], type_: str) -> bool:
    conditions = as_map(obj.get("status")).get("conditions")
    return any(
        as_map(c).get("type") == type_ and as_map(c).get("status") == "True"
        for c in (conditions if isinstance(conditions, list) else ())
    )


def _troubled(pod: Mapping[str, Any]) -> bool:
    """The pod failed, is going, was disrupted, or a container of it ended badly or restarted."""
    status = as_map(pod.get("status"))
    if meta_of(pod).get("deletionTimestamp") or status.get("phase") == "Failed" or status.get("reason"):
        return True
    if _true(pod, "DisruptionTarget"):
        return True
    for key in ("containerStatuses", "initContainerStatuses"):
        statuses = status.get(key)
        for cs in statuses if isinstance(statuses, list) else ():
            cs = as_map(cs)
            if cs.get("restartCount"):
                return True
            for state in (as_map(cs.get("state")), as_map(cs.get("lastState"))):
                code = as_map(state.get("terminated")).get("exitCode")
                if "terminated" in state and code != 0:
                    return True
    return False


def _every_node_there(trainjob: Mapping[str, Any], pods: list[dict[str, Any]]) -> bool:
    """A live pod for every node: a node whose pod is gone (deleted, preempted and removed) may be what a
    Job's condition is about."""
    nodes = as_map(as_map(trainjob.get("spec")).get("trainer")).get("numNodes")
    if not isinstance(nodes, int) or isinstance(nodes, bool) or nodes < 1:
        return False
    seen = set()
    for pod in pods:
        containers = as_map(pod.get("spec")).get("containers")
        if isinstance(containers, list) and any(as_map(c).get("name") == NODE_CONTAINER for c in containers):
            seen.add(labels_of(pod).get(LABEL_INDEX))
    return all(str(i) in seen for i in range(nodes))


def plain(trainjob: Mapping[str, Any] | None, pods: list[dict[str, Any]]) -> bool:
    """Whether the incarnation of ``trainjob`` (with ``pods``) reads the same without its JobSet, Jobs and
    Workload (see the module docstring). A TrainJob not there is not plain (its absence is read fully)."""
    if trainjob is None or meta_of(trainjob).get("deletionTimestamp"):
        return False
    if as_map(trainjob.get("spec")).get("suspend") is True or LABEL_QUEUE in labels_of(trainjob):
        return False
    if _true(trainjob, "Failed"):
        return False
    if _true(trainjob, "Complete"):
        return True
    return _every_node_there(trainjob, pods) and not any(_troubled(p) for p in pods)
