"""The cause table (dispatch_kubeflow.causes), pure: one case per rule, the first-match order, the docs
table kept identical to the rule list, and malformed objects always giving a typed outcome."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dispatch import Cause, Outcome, State
from dispatch_kubeflow.causes import (
    CONFIG_ERROR_GRACE,
    IMAGE_PULL_GRACE,
    RULES,
    Snapshot,
    classify,
    rule_of,
    table_markdown,
)
from dispatch_kubeflow.names import ANNOTATION_HOLD

DOCS = Path(__file__).resolve().parents[2] / "docs" / "kubeflow-causes.md"
T0 = "2026-01-01T00:00:00Z"
T0_S = 1767225600.0


# --- object builders (the shapes the real API server serves) -----------------------------------------


def cond(type_: str, reason: str = "", status: str = "True", message: str = "m") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": T0}


def trainjob(
    *conditions: dict[str, Any], suspend: bool = False, queue: bool = False, **meta: Any
) -> dict[str, Any]:
    labels = {"kueue.x-k8s.io/queue-name": "q"} if queue else {}
    obj: dict[str, Any] = {
        "kind": "TrainJob",
        "metadata": {"name": "tj", "labels": labels, **meta},
        "spec": {"trainer": {"numNodes": 2}, "suspend": suspend},
        "status": {"conditions": list(conditions)},
    }
    return obj


def obj(kind: str, name: str, *conditions: dict[str, Any], **status: Any) -> dict[str, Any]:
    return {"kind": kind, "metadata": {"name": name}, "status": {"conditions": list(conditions), **status}}


def workload(*conditions: dict[str, Any], active: bool = True, **status: Any) -> dict[str, Any]:
    wl = obj("Workload", "trainjob-tj-abcde", *conditions, **status)
    wl["spec"] = {"active": active}
    return wl


def container(
    *,
    name: str = "node",
    state: dict[str, Any] | None = None,
    last: dict[str, Any] | None = None,
    restarts: int = 0,
) -> dict[str, Any]:
    cs: dict[str, Any] = {
        "name": name,
        "state": state or {"running": {"startedAt": T0}},
        "restartCount": restarts,
    }
    if last is not None:
        cs["lastState"] = last
    return cs


def terminated(code: int, reason: str = "Error", message: str = "") -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": reason, "message": message, "finishedAt": T0}}


def pod(
    name: str = "tj-node-0-0-abcde",
    phase: str = "Running",
    *containers: dict[str, Any],
    conditions: tuple[dict[str, Any], ...] = (),
    node: str | None = "node-1",
    deleting: bool = False,
    **status: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "creationTimestamp": T0}
    if deleting:
        meta["deletionTimestamp"] = T0
    spec = {"nodeName": node} if node else {}
    return {
        "kind": "Pod",
        "metadata": meta,
        "spec": spec,
        "status": {
            "phase": phase,
            "conditions": list(conditions),
            "containerStatuses": list(containers) or [container()],
            **status,
        },
    }


def running_pods() -> list[dict[str, Any]]:
    return [pod("p0"), pod("p1")]


HOLD = {ANNOTATION_HOLD: "h-0123"}
FAILING_JOB = obj("Job", "tj-node-0", cond("FailureTarget", "BackoffLimitExceeded"))
FAILED_TJ = trainjob(cond("Failed", "FailedJobs", message="jobset failed due to one or more job failures"))


def snap(tj: Any = None, **kw: Any) -> Snapshot:
    return Snapshot.of("tj", trainjob() if tj is None else tj, now=kw.pop("now", T0_S + 1), **kw)


# --- one case per row: (description, snapshot, rule, state, cause, evidence kind/name/reason) ----------

CASES: list[tuple[str, Snapshot, str, State, Cause, tuple[str, str, str]]] = [
    (
        "stopped by dispatch",
        snap(None, stopped=True),
        "we_cancelled",
        State.CANCELLED,
        Cause.CANCELLED,
        ("TrainJob", "tj", "Deleting"),
    ),
    (
        "gone after our stop",
        Snapshot.of("tj", None, stopped=True),
        "we_cancelled",
        State.CANCELLED,
        Cause.CANCELLED,
        ("TrainJob", "tj", "Deleted"),
    ),
    (
        "held by dispatch (suspended, no Kueue)",
        snap(trainjob(cond("Suspended", "Suspended"), suspend=True, annotations=HOLD)),
        "held",
        State.HELD,
        Cause.NONE,
        ("TrainJob", "tj", "HeldByDispatch"),
    ),
    (
        "held by dispatch: Kueue evicting it for the admission check",
        snap(
            trainjob(queue=True, annotations=HOLD),
            pods=running_pods(),
            workload=workload(cond("Evicted", "AdmissionCheck"), cond("QuotaReserved", "QuotaReserved")),
        ),
        "held",
        State.HELD,
        Cause.NONE,
        ("TrainJob", "tj", "HeldByDispatch"),
    ),
    (
        "Kueue preempted",
        snap(
            trainjob(suspend=True, queue=True),
            workload=workload(cond("Evicted", "Preempted"), cond("Preempted", "InClusterQueue")),
        ),
        "kueue_preempted",
        State.QUEUED,
        Cause.PREEMPTED,
        ("Workload", "trainjob-tj-abcde", "Preempted"),
    ),
    (
        "Kueue preempted in cohort",
        snap(trainjob(suspend=True, queue=True), workload=workload(cond("Preempted", "InCohortReclamation"))),
        "kueue_preempted",
        State.QUEUED,
        Cause.PREEMPTED,
        ("Workload", "trainjob-tj-abcde", "InCohortReclamation"),
    ),
    (
        "Kueue node failures",
        snap(trainjob(suspend=True, queue=True), workload=workload(cond("Evicted", "NodeFailures"))),
        "kueue_node_failures",
        State.QUEUED,
        Cause.NODE_LOST,
        ("Workload", "trainjob-tj-abcde", "NodeFailures"),
    ),
    (
        "Kueue pods-ready timeout",
        snap(trainjob(suspend=True, queue=True), workload=workload(cond("Evicted", "PodsReadyTimeout"))),
        "kueue_no_capacity",
        State.QUEUED,
        Cause.NO_CAPACITY,
        ("Workload", "trainjob-tj-abcde", "PodsReadyTimeout"),
    ),
    (
        "Kueue no matching flavor",
        snap(
            trainjob(suspend=True, queue=True),
            workload=workload(cond("QuotaReserved", "NoMatchingFlavor", "False")),
        ),
        "kueue_no_capacity",
        State.QUEUED,
        Cause.NO_CAPACITY,
        ("Workload", "trainjob-tj-abcde", "NoMatchingFlavor"),
    ),
    (
        "Kueue exceeds max quota",
        snap(
            trainjob(suspend=True, queue=True),
            workload=workload(cond("QuotaReserved", "ExceedsMaxQuota", "False")),
        ),
        "kueue_no_capacity",
        State.QUEUED,
        Cause.NO_CAPACITY,
        ("Workload", "trainjob-tj-abcde", "ExceedsMaxQuota"),
    ),
    (
        "Kueue requeuing limit",
        snap(
            trainjob(suspend=True, queue=True),
            workload=workload(cond("DeactivationTarget", "RequeuingLimitExceeded"), active=False),
        ),
        "kueue_no_capacity",
        State.FAILED,
        Cause.NO_CAPACITY,
        ("Workload", "trainjob-tj-abcde", "RequeuingLimitExceeded"),
    ),
    (
        "Kueue max execution time (target)",
        snap(
            trainjob(suspend=True, queue=True),
            workload=workload(cond("DeactivationTarget", "MaximumExecutionTimeExceeded"), active=False),
        ),
        "kueue_max_exec",
        State.FAILED,
        Cause.TIMEOUT,
        ("Workload", "trainjob-tj-abcde", "MaximumExecutionTimeExceeded"),
    ),
    (
        "Kueue max execution time (evicted, underlying cause)",
        snap(
            trainjob(suspend=True, queue=True),
            workload=workload(
                cond(
                    "Evicted",
                    "Deactivated",
                    message="The workload is deactivated due to exceeding the maximum execution time",
                ),
                active=False,
                schedulingStats={
                    "evictions": [
                        {
                            "reason": "Deactivated",
                            "underlyingCause": "MaximumExecutionTimeExceeded",
                            "count": 1,
                        }
                    ]
                },
            ),
        ),
        "kueue_max_exec",
        State.FAILED,
        Cause.TIMEOUT,
        ("Workload", "trainjob-tj-abcde", "Deactivated"),
    ),
    (
        "pod preempted by the scheduler",
        snap(
            jobs=[FAILING_JOB],
            pods=[pod("p0", conditions=(cond("DisruptionTarget", "PreemptionByScheduler"),), deleting=True)],
        ),
        "pod_preempted",
        State.FAILED,
        Cause.PREEMPTED,
        ("Pod", "p0", "PreemptionByScheduler"),
    ),
    (
        "pod deleted by the taint manager",
        snap(
            jobs=[FAILING_JOB],
            pods=[pod("p0", conditions=(cond("DisruptionTarget", "DeletionByTaintManager"),), deleting=True)],
        ),
        "pod_node_lost",
        State.FAILED,
        Cause.NODE_LOST,
        ("Pod", "p0", "DeletionByTaintManager"),
    ),
    (
        "pod deleted by pod GC",
        snap(jobs=[FAILING_JOB], pods=[pod("p0", conditions=(cond("DisruptionTarget", "DeletionByPodGC"),))]),
        "pod_node_lost",
        State.FAILED,
        Cause.NODE_LOST,
        ("Pod", "p0", "DeletionByPodGC"),
    ),
    (
        "pod terminated by the kubelet (shutdown)",
        snap(
            jobs=[FAILING_JOB],
            pods=[
                pod(
                    "p0",
                    "Failed",
                    conditions=(cond("DisruptionTarget", "TerminationByKubelet"),),
                    reason="Terminated",
                )
            ],
        ),
        "pod_node_lost",
        State.FAILED,
        Cause.NODE_LOST,
        ("Pod", "p0", "TerminationByKubelet"),
    ),
    (
        "pod evicted through the Eviction API",
        snap(
            jobs=[FAILING_JOB],
            pods=[pod("p0", conditions=(cond("DisruptionTarget", "EvictionByEvictionAPI"),), deleting=True)],
        ),
        "pod_evicted",
        State.FAILED,
        Cause.EVICTED,
        ("Pod", "p0", "EvictionByEvictionAPI"),
    ),
    (
        "pod evicted for node pressure",
        snap(
            jobs=[FAILING_JOB],
            pods=[
                pod(
                    "p0",
                    "Failed",
                    conditions=(cond("DisruptionTarget", "TerminationByKubelet"),),
                    reason="Evicted",
                    message="The node was low on resource: memory.",
                )
            ],
        ),
        "pod_evicted",
        State.FAILED,
        Cause.EVICTED,
        ("Pod", "p0", "Evicted"),
    ),
    (
        "OOM in state (restartPolicy Never)",
        snap(FAILED_TJ, pods=[pod("p0", "Failed", container(state=terminated(137, "OOMKilled")))]),
        "oom",
        State.FAILED,
        Cause.OUT_OF_MEMORY,
        ("Pod", "p0", "OOMKilled"),
    ),
    (
        "OOM in lastState (restartPolicy OnFailure)",
        snap(
            FAILED_TJ,
            pods=[
                pod(
                    "p0",
                    "Running",
                    container(
                        state={"waiting": {"reason": "CrashLoopBackOff"}},
                        last=terminated(137, "OOMKilled"),
                        restarts=6,
                    ),
                )
            ],
        ),
        "oom",
        State.FAILED,
        Cause.OUT_OF_MEMORY,
        ("Pod", "p0", "OOMKilled"),
    ),
    (
        "TrainJob deadline",
        snap(trainjob(cond("Failed", "DeadlineExceeded"))),
        "deadline",
        State.FAILED,
        Cause.TIMEOUT,
        ("TrainJob", "tj", "DeadlineExceeded"),
    ),
    (
        "Job deadline while failing",
        snap(jobs=[obj("Job", "tj-node-0", cond("FailureTarget", "DeadlineExceeded"))]),
        "deadline",
        State.FAILED,
        Cause.TIMEOUT,
        ("Job", "tj-node-0", "DeadlineExceeded"),
    ),
    (
        "runtime not supported",
        snap(trainjob(cond("Failed", "TrainingRuntimeNotSupported"))),
        "invalid_spec",
        State.FAILED,
        Cause.INVALID_SPEC,
        ("TrainJob", "tj", "TrainingRuntimeNotSupported"),
    ),
    (
        "image pull, within the grace period",
        snap(
            pods=[
                pod(
                    "p0",
                    "Pending",
                    container(state={"waiting": {"reason": "ImagePullBackOff", "message": "Back-off"}}),
                )
            ]
        ),
        "image_pull",
        State.STARTING,
        Cause.IMAGE_PULL,
        ("Pod", "p0", "ImagePullBackOff"),
    ),
    (
        "image pull, past the grace period",
        snap(
            pods=[pod("p0", "Pending", container(state={"waiting": {"reason": "ErrImagePull"}}))],
            now=T0_S + IMAGE_PULL_GRACE,
        ),
        "image_pull",
        State.FAILED,
        Cause.IMAGE_PULL,
        ("Pod", "p0", "ErrImagePull"),
    ),
    (
        "failed, pods gone: the Event of a preemption",
        snap(
            FAILED_TJ,
            events=[
                {
                    "involvedObject": {"kind": "Pod", "name": "tj-node-0-0-abcde"},
                    "reason": "Preempted",
                    "message": "Preempted by pod on node node-1",
                    "lastTimestamp": T0,
                }
            ],
        ),
        "outlived",
        State.FAILED,
        Cause.PREEMPTED,
        ("Pod", "tj-node-0-0-abcde", "Preempted"),
    ),
    (
        "failed, pods gone: the Workload's eviction",
        snap(FAILED_TJ, workload=workload(cond("Finished", "Failed"), cond("Evicted", "NodeFailures"))),
        "outlived",
        State.FAILED,
        Cause.NODE_LOST,
        ("Workload", "trainjob-tj-abcde", "NodeFailures"),
    ),
    (
        "a missing Secret",
        snap(
            pods=[
                pod(
                    "p0",
                    "Pending",
                    container(
                        state={
                            "waiting": {
                                "reason": "CreateContainerConfigError",
                                "message": 'secret "db-password" not found',
                            }
                        }
                    ),
                )
            ]
        ),
        "config_error",
        State.STARTING,
        Cause.CONFIG_ERROR,
        ("Pod", "p0", "CreateContainerConfigError"),
    ),
    (
        "a container that cannot be created, past the grace period",
        snap(
            pods=[pod("p0", "Pending", container(state={"waiting": {"reason": "CreateContainerError"}}))],
            now=T0_S + CONFIG_ERROR_GRACE,
        ),
        "config_error",
        State.FAILED,
        Cause.CONFIG_ERROR,
        ("Pod", "p0", "CreateContainerError"),
    ),
    (
        "stuck ContainerCreating",
        snap(
            pods=[pod("p0", "Pending", container(state={"waiting": {"reason": "ContainerCreating"}}))],
            now=T0_S + CONFIG_ERROR_GRACE,
        ),
        "config_error",
        State.STARTING,
        Cause.CONFIG_ERROR,
        ("Pod", "p0", "ContainerCreating"),
    ),
    (
        "invalid image name",
        snap(pods=[pod("p0", "Pending", container(state={"waiting": {"reason": "InvalidImageName"}}))]),
        "image_pull",
        State.FAILED,
        Cause.IMAGE_PULL,
        ("Pod", "p0", "InvalidImageName"),
    ),
    (
        "unschedulable",
        snap(
            pods=[
                pod(
                    "p0",
                    "Pending",
                    conditions=(cond("PodScheduled", "Unschedulable", "False", "0/4 nodes are available"),),
                    node=None,
                )
            ]
        ),
        "unschedulable",
        State.QUEUED,
        Cause.NO_CAPACITY,
        ("Pod", "p0", "Unschedulable"),
    ),
    (
        "exit code 3",
        snap(FAILED_TJ, pods=[pod("p0", "Failed", container(state=terminated(3)))]),
        "exit_code",
        State.FAILED,
        Cause.EXIT_CODE,
        ("Pod", "p0", "Error"),
    ),
    (
        "exit code while the Job is failing",
        snap(jobs=[FAILING_JOB], pods=[pod("p0", "Failed", container(state=terminated(3)))]),
        "exit_code",
        State.FAILED,
        Cause.EXIT_CODE,
        ("Pod", "p0", "Error"),
    ),
    (
        "complete",
        snap(trainjob(cond("Complete", "AllJobsCompleted"))),
        "complete",
        State.SUCCEEDED,
        Cause.NONE,
        ("TrainJob", "tj", "AllJobsCompleted"),
    ),
    (
        "gone, not by us",
        Snapshot.of("tj", None),
        "gone",
        State.LOST,
        Cause.UNKNOWN,
        ("TrainJob", "tj", "NotFound"),
    ),
    (
        "deleted by someone else",
        snap(trainjob(deletionTimestamp=T0)),
        "gone",
        State.LOST,
        Cause.UNKNOWN,
        ("TrainJob", "tj", "Deleting"),
    ),
    (
        "failed, nothing else known",
        snap(FAILED_TJ),
        "failed_otherwise",
        State.FAILED,
        Cause.UNKNOWN,
        ("TrainJob", "tj", "FailedJobs"),
    ),
    (
        "restarting in place while running",
        snap(pods=[pod("p0", "Running", container(last=terminated(1), restarts=4)), pod("p1")]),
        "restarting",
        State.RUNNING,
        Cause.EXIT_CODE,
        ("Pod", "p0", "Error"),
    ),
    (
        "JobSet recreated",
        snap(pods=running_pods(), jobset=obj("JobSet", "tj", restarts=2)),
        "restarting",
        State.RUNNING,
        Cause.UNKNOWN,
        ("JobSet", "tj", "Restarts"),
    ),
    (
        "held",
        snap(trainjob(cond("Suspended", "Suspended"), suspend=True)),
        "live",
        State.HELD,
        Cause.NONE,
        ("TrainJob", "tj", "Suspended"),
    ),
    (
        "queued by Kueue",
        snap(trainjob(suspend=True, queue=True)),
        "live",
        State.QUEUED,
        Cause.NONE,
        ("TrainJob", "tj", "Suspended"),
    ),
]


@pytest.mark.parametrize(
    ("what", "snapshot", "rule", "state", "cause", "evidence"), CASES, ids=[c[0] for c in CASES]
)
def test_each_rule(
    what: str, snapshot: Snapshot, rule: str, state: State, cause: Cause, evidence: tuple[str, str, str]
) -> None:
    out = classify(snapshot)
    assert rule_of(snapshot).name == rule, what
    assert (out.state, out.cause) == (state, cause), f"{what}: {out}"
    first = out.evidence[0]
    assert (first.kind, first.name, first.reason) == evidence, f"{what}: {first}"


def test_every_rule_has_a_case() -> None:
    assert {r.name for r in RULES} == {c[2] for c in CASES}


def test_running_and_starting() -> None:
    assert classify(snap(pods=running_pods())) == Outcome(State.RUNNING, Cause.NONE)
    assert classify(snap(pods=[pod("p0"), pod("p1", "Pending")])).state is State.STARTING
    assert classify(snap(pods=[pod("p0")])).state is State.STARTING  # one of two nodes
    assert classify(snap(trainjob(cond("Suspended", "Resumed", "False")))).state is State.STARTING


def test_evidence_names_node_and_exit_code() -> None:
    out = classify(
        snap(FAILED_TJ, pods=[pod("p0", "Failed", container(state=terminated(3, message="boom")))])
    )
    ev = out.evidence[0]
    assert (ev.exit_code, ev.node, ev.message) == (3, "node-1", "boom")
    assert out.evidence[1].kind == "TrainJob" and out.evidence[1].reason == "FailedJobs"
    assert ev.at == T0_S


def test_an_exit_code_names_the_jobs_backoff_limit_not_the_copies_above_it() -> None:
    """The real chain: the Job fails (``BackoffLimitExceeded``), JobSet reacts (``FailedJobs``, naming the
    Job), the Trainer copies the JobSet's condition into the TrainJob; the Job's is the evidence, whether
    the copies are there yet or not, and it outlives the pods (the cause is then honestly unknown)."""
    job = obj(
        "Job",
        "tj-node-0",
        cond("Failed", "BackoffLimitExceeded", message="Job has reached the specified backoff limit"),
    )
    jobset = obj("JobSet", "tj", cond("Failed", "FailedJobs"))
    failed = pod("p0", "Failed", container(state=terminated(3)))
    for parts in ({}, {"jobset": jobset}, {"jobset": jobset, "trainjob": FAILED_TJ}):
        out = classify(
            snap(parts.get("trainjob", trainjob()), jobset=parts.get("jobset"), jobs=[job], pods=[failed])
        )
        assert (out.state, out.cause) == (State.FAILED, Cause.EXIT_CODE), parts
        assert [(e.kind, e.reason) for e in out.evidence[:2]] == [
            ("Pod", "Error"),
            ("Job", "BackoffLimitExceeded"),
        ]
    gone = classify(snap(FAILED_TJ, jobset=jobset, jobs=[job]))
    assert (gone.state, gone.cause) == (State.FAILED, Cause.UNKNOWN)
    assert (gone.evidence[0].kind, gone.evidence[0].name, gone.evidence[0].reason) == (
        "Job",
        "tj-node-0",
        "BackoffLimitExceeded",
    )


def test_oom_while_restarting_in_place_is_not_plain_running() -> None:
    """OnFailure: the container restarts after an OOM; while the Job still tries, the job is running, but
    its cause and evidence say what keeps happening."""
    p = pod("p0", "Running", container(last=terminated(137, "OOMKilled"), restarts=2))
    out = classify(snap(pods=[p, pod("p1")]))
    assert (out.state, out.cause) == (State.RUNNING, Cause.OUT_OF_MEMORY)
    assert "restarted 2 times" in out.evidence[0].message


def test_a_disrupted_pod_being_replaced_is_not_failed() -> None:
    p = pod("p0", conditions=(cond("DisruptionTarget", "DeletionByTaintManager"),), deleting=True)
    out = classify(snap(pods=[p, pod("p1")]))
    assert (out.state, out.cause) == (State.STARTING, Cause.NODE_LOST)


def test_kueue_signals_stop_counting_once_the_job_finished() -> None:
    wl = workload(cond("Evicted", "Preempted"))
    out = classify(snap(trainjob(cond("Complete", "AllJobsCompleted")), workload=wl))
    assert out.state is State.SUCCEEDED
    readmitted = workload(cond("Evicted", "QuotaReserved", "False"), cond("QuotaReserved", "QuotaReserved"))
    assert classify(snap(pods=running_pods(), workload=readmitted)).state is State.RUNNING


def test_quota_wait_is_queued_with_the_workload_reason() -> None:
    wl = workload(cond("QuotaReserved", "WaitingForQuota", "False"))
    out = classify(snap(trainjob(suspend=True, queue=True), workload=wl))
    assert (out.state, out.cause) == (State.QUEUED, Cause.NONE)
    assert [e.kind for e in out.evidence] == ["TrainJob", "Workload"]


def test_first_match_order_cancel_beats_everything() -> None:
    s = snap(
        FAILED_TJ, stopped=True, pods=[pod("p0", "Failed", container(state=terminated(137, "OOMKilled")))]
    )
    assert classify(s).cause is Cause.CANCELLED
    s = snap(FAILED_TJ, pods=[pod("p0", "Failed", container(state=terminated(137, "OOMKilled")))])
    assert classify(s).cause is Cause.OUT_OF_MEMORY  # OOM (row 10) before exit code (row 15)


def test_our_hold_comes_before_kueue_and_the_generic_suspended_reading() -> None:
    """An eviction of a held job (for the admission check, or any other reason) is the hold; a hold not in
    effect yet, an ended, failing or deactivated job, and a suspension without our annotation are not."""
    queued = trainjob(suspend=True, queue=True, annotations=HOLD)
    preempted = workload(cond("Evicted", "Preempted"), cond("Preempted", "InClusterQueue"))
    out = classify(snap(queued, workload=preempted))
    assert (out.state, out.cause) == (State.HELD, Cause.NONE)
    assert [e.reason for e in out.evidence] == ["HeldByDispatch", "Preempted"]
    assert ANNOTATION_HOLD in out.evidence[0].message and "h-0123" not in out.evidence[0].message
    # Created held under Kueue: suspended by Kueue, the check Pending, quota maybe reserved.
    waiting = workload(cond("QuotaReserved", "QuotaReserved"))
    assert classify(snap(queued, workload=waiting)).state is State.HELD
    # Without our annotation the same objects read as Kueue says.
    plain = trainjob(suspend=True, queue=True)
    assert classify(snap(plain, workload=preempted)).cause is Cause.PREEMPTED
    assert classify(snap(plain, workload=waiting)).state is State.QUEUED
    running = trainjob(queue=True)
    evicting = workload(cond("Evicted", "AdmissionCheck"), cond("QuotaReserved", "QuotaReserved"))
    assert rule_of(snap(running, pods=running_pods(), workload=evicting)).name != "held"
    # Asked for, not in effect yet (dispatch-admission has not had Kueue evict it): the job still runs.
    held_running = trainjob(queue=True, annotations=HOLD)
    admitted = workload(cond("QuotaReserved", "QuotaReserved"), cond("Admitted", "Admitted"))
    assert classify(snap(held_running, pods=running_pods(), workload=admitted)).state is State.RUNNING
    # What ended the job wins over the hold.
    done = trainjob(cond("Complete", "AllJobsCompleted"), annotations=HOLD)
    assert classify(snap(done, workload=evicting)).state is State.SUCCEEDED
    failed = trainjob(cond("Failed", "FailedJobs"), suspend=True, annotations=HOLD)
    assert classify(snap(failed)).state is State.FAILED
    failing = snap(trainjob(suspend=True, annotations=HOLD), jobs=[FAILING_JOB])
    assert classify(failing).state is State.FAILED
    deactivated = workload(
        cond("DeactivationTarget", "MaximumExecutionTimeExceeded"),
        cond("Evicted", "Deactivated"),
        active=False,
    )
    assert classify(snap(queued, workload=deactivated)).cause is Cause.TIMEOUT
    assert classify(snap(trainjob(suspend=True, annotations=HOLD, deletionTimestamp=T0))).state is State.LOST
    assert classify(snap(trainjob(suspend=True, annotations=HOLD), stopped=True)).cause is Cause.CANCELLED


# --- docs ----------------------------------------------------------------------------------------------


def test_docs_table_is_the_rule_list() -> None:
    text = DOCS.read_text()
    found = re.search(r"<!-- causes-table:begin[^>]*-->\n(.*?)<!-- causes-table:end -->", text, re.S)
    assert found, "docs/kubeflow-causes.md lost its generated table markers"
    assert found.group(1) == table_markdown(), (
        "docs/kubeflow-causes.md is out of date: regenerate the table with "
        "dispatch_kubeflow.causes.table_markdown()"
    )
    assert len(RULES) == table_markdown().count("\n") - 2


# --- malformed objects -------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
_keys = st.sampled_from(
    [
        "metadata",
        "spec",
        "status",
        "conditions",
        "containerStatuses",
        "state",
        "lastState",
        "terminated",
        "waiting",
        "exitCode",
        "reason",
        "type",
        "status",
        "name",
        "labels",
        "deletionTimestamp",
        "suspend",
        "trainer",
        "numNodes",
        "restartCount",
        "phase",
        "nodeName",
        "lastTransitionTime",
        "active",
        "schedulingStats",
        "evictions",
        "underlyingCause",
        "restarts",
        "initContainerStatuses",
    ]
)


def _mutate(base: Any, data: st.DataObject) -> Any:
    """Replace a random path of a well-formed object with random JSON (or add a random key)."""
    out = copy.deepcopy(base)
    node = out
    for _ in range(data.draw(st.integers(0, 5))):
        if isinstance(node, dict) and node:
            key = data.draw(st.sampled_from(sorted(node)))
            if not isinstance(node[key], dict | list) or data.draw(st.booleans()):
                node[key] = data.draw(_json)
                return out
            node = node[key]
        elif isinstance(node, list) and node:
            i = data.draw(st.integers(0, len(node) - 1))
            if not isinstance(node[i], dict | list):
                node[i] = data.draw(_json)
                return out
            node = node[i]
    if isinstance(node, dict):
        node[data.draw(_keys)] = data.draw(_json)
    return out


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_any_malformed_object_gives_a_typed_outcome(data: st.DataObject) -> None:
    tj = trainjob(cond("Failed", "FailedJobs"), cond("Suspended", "Resumed", "False"), queue=True)
    pods = [
        pod(
            "p0",
            "Failed",
            container(state=terminated(137, "OOMKilled"), last=terminated(1), restarts=2),
            conditions=(
                cond("DisruptionTarget", "PreemptionByScheduler"),
                cond("PodScheduled", "Unschedulable", "False"),
            ),
        ),
        pod("p1", "Pending", container(state={"waiting": {"reason": "ErrImagePull"}})),
    ]
    wl = workload(
        cond("Evicted", "Preempted"),
        cond("QuotaReserved", "NoMatchingFlavor", "False"),
        schedulingStats={"evictions": [{"underlyingCause": "x"}]},
    )
    js = obj("JobSet", "tj", cond("Failed", "FailedJobs"), restarts=1)
    snapshot = Snapshot.of(
        "tj",
        _mutate(tj, data) if data.draw(st.booleans()) else data.draw(_json),
        jobset=_mutate(js, data),
        jobs=[_mutate(FAILING_JOB, data), data.draw(_json)],
        pods=[_mutate(p, data) for p in pods] + [data.draw(_json)],
        workload=_mutate(wl, data),
        now=T0_S,
    )
    out = classify(snapshot)
    assert isinstance(out, Outcome)
    for ev in out.evidence:
        assert isinstance(ev.kind, str) and isinstance(ev.name, str) and isinstance(ev.reason, str)


@given(st.one_of(_json, st.lists(_json)), st.one_of(_json, st.lists(_json)))
def test_snapshot_of_anything(trainjob_value: Any, many: Any) -> None:
    out = classify(Snapshot.of("tj", trainjob_value, jobset=many, jobs=many, pods=many, workload=many))
    assert isinstance(out, Outcome)


def test_a_kueue_requeue_is_evidence_while_the_job_runs_again() -> None:
    wl = workload(
        cond("QuotaReserved", "QuotaReserved"),
        cond("Evicted", "QuotaReserved", "False"),
        cond("Requeued", "NodeFailures", message="Workload eviction triggered due to node failures: node-2"),
    )
    out = classify(snap(pods=running_pods(), workload=wl))
    assert (out.state, out.cause) == (State.RUNNING, Cause.NODE_LOST)
    assert (out.evidence[0].kind, out.evidence[0].reason) == ("Workload", "NodeFailures")


def test_a_complete_trainjob_is_succeeded_whatever_its_pods_show() -> None:
    """kubernetes/kubernetes#116042: a pod can read OOMKilled with exit code 0 under memory pressure; a
    container restarted in place before it succeeded. The TrainJob's Complete decides; both are evidence."""
    oom_zero = pod("p0", "Succeeded", container(state=terminated(0, "OOMKilled")))
    restarted = pod(
        "p1",
        "Succeeded",
        container(state=terminated(0, "Completed"), last=terminated(137, "OOMKilled"), restarts=1),
    )
    out = classify(snap(trainjob(cond("Complete", "AllJobsCompleted")), pods=[oom_zero, restarted]))
    assert (out.state, out.cause) == (State.SUCCEEDED, Cause.NONE), out
    assert [(e.kind, e.name, e.reason) for e in out.evidence] == [
        ("TrainJob", "tj", "AllJobsCompleted"),
        ("Pod", "p0", "OOMKilled"),
        ("Pod", "p1", "OOMKilled"),
    ]
    assert out.evidence[1].exit_code == 0 and "restarted 1 time" in out.evidence[2].message
    # Without Complete the same pod is what keeps happening: a live cause, never a finished job.
    live = classify(
        snap(pods=[pod("p0", "Running", container(last=terminated(137, "OOMKilled"), restarts=1)), pod("p1")])
    )
    assert (live.state, live.cause) == (State.RUNNING, Cause.OUT_OF_MEMORY)


def test_an_unschedulable_pod_does_not_keep_a_failed_job_queued() -> None:
    unschedulable = pod("p0", "Pending", conditions=(cond("PodScheduled", "Unschedulable", "False"),))
    assert classify(snap(FAILED_TJ, pods=[unschedulable])).state is State.FAILED


def test_a_node_that_finished_first_does_not_make_a_running_job_starting() -> None:
    done = pod("p1", "Succeeded", container(state=terminated(0, "Completed")))
    assert classify(snap(pods=[pod("p0"), done])).state is State.RUNNING


def test_every_node_finished_before_the_trainjob_says_complete_is_still_running() -> None:
    # Seen in the quick start: running -> starting -> succeeded, because finished pods read as "starting".
    done = [pod(f"p{i}", "Succeeded", container(state=terminated(0, "Completed"))) for i in range(2)]
    assert classify(snap(pods=done)).state is State.RUNNING


# --- the TrainJob schema (trainer_schema) -----------------------------------------------------------------


def test_the_schema_of_a_v2_3_crd_has_every_field_dispatch_sends() -> None:
    from dispatch_kubeflow.trainer_schema import missing_fields, schema_from_crd
    from kubesim.crds import trainjob_crd

    schema = schema_from_crd(trainjob_crd())
    assert schema is not None and missing_fields(schema) == []
    old = schema_from_crd(trainjob_crd(without=("runtimePatches", "trainer.numProcPerNode")))
    assert old is not None
    reasons = missing_fields(old)
    assert len(reasons) == 2
    assert "spec.trainer.numProcPerNode" in reasons[0] and "v2.2" in reasons[0]
    assert "spec.runtimePatches" in reasons[1]


def test_the_schema_from_an_openapi_v3_document_follows_refs() -> None:
    from dispatch_kubeflow.trainer_schema import missing_fields, schema_from_openapi

    prefix = "#/components/schemas/"
    doc = {
        "components": {
            "schemas": {
                "TJ": {
                    "x-kubernetes-group-version-kind": [
                        {"group": "trainer.kubeflow.org", "version": "v1alpha1", "kind": "TrainJob"}
                    ],
                    "properties": {"spec": {"allOf": [{"$ref": prefix + "Spec"}]}},
                },
                "Spec": {
                    "properties": {
                        "runtimeRef": {"$ref": prefix + "Ref"},
                        "trainer": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                        "suspend": {"type": "boolean"},
                        "activeDeadlineSeconds": {"type": "integer"},
                    }
                },
                "Ref": {"properties": {k: {"type": "string"} for k in ("name", "kind", "apiGroup")}},
            }
        }
    }
    schema = schema_from_openapi(doc)
    assert schema is not None
    # trainer keeps unknown fields (nothing it lacks can be told); runtimePatches is missing.
    assert [r.split(",")[0] for r in missing_fields(schema)] == [
        "the cluster's TrainJob schema has no spec.runtimePatches"
    ]
    assert schema_from_openapi({"components": {"schemas": {}}}) is None
    assert schema_from_openapi("not a document") is None
