"""A basic reading of an incarnation's state from its TrainJob and pods (pure).

This covers what TrainJob conditions say (Complete, Failed with DeadlineExceeded or
TrainingRuntimeNotSupported, a container's non-zero exit code), suspension, deletion, and running vs
starting from the pods. The full cause table of SPEC §9.7 (Kueue Workloads, disruption conditions, OOM,
image pulls, ...) builds on this.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dispatch.model import Cause, Evidence, Outcome, State
from dispatch_kubeflow.holds import held_by_us, hold_evidence
from dispatch_kubeflow.names import LABEL_QUEUE, NODE_CONTAINER

__all__ = ["cancelled", "lost", "outcome_of"]


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _true_conditions(obj: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    out: dict[str, Mapping[str, Any]] = {}
    conditions = _map(obj.get("status")).get("conditions")
    for c in conditions if isinstance(conditions, list) else []:
        c = _map(c)
        if c.get("status") == "True" and isinstance(c.get("type"), str):
            out[c["type"]] = c
    return out


def _evidence(
    obj: Mapping[str, Any], condition: Mapping[str, Any] | None = None, *, reason: str = "", message: str = ""
) -> Evidence:
    if condition is not None:
        reason, message = str(condition.get("reason", "")), str(condition.get("message", ""))
    return Evidence(
        kind=str(obj.get("kind") or "TrainJob"),
        name=str(_map(obj.get("metadata")).get("name", "")),
        reason=reason,
        message=message,
    )


def _failed_container(pods: Sequence[Mapping[str, Any]]) -> Evidence | None:
    for pod in pods:
        statuses = _map(pod.get("status")).get("containerStatuses")
        for cs in statuses if isinstance(statuses, list) else []:
            cs = _map(cs)
            if cs.get("name") != NODE_CONTAINER:
                continue
            # With restartPolicy OnFailure the last exit sits in lastState while the container restarts.
            term = _map(_map(cs.get("state")).get("terminated")) or _map(
                _map(cs.get("lastState")).get("terminated")
            )
            code = term.get("exitCode")
            if isinstance(code, int) and code != 0:
                return Evidence(
                    kind="Pod",
                    name=str(_map(pod.get("metadata")).get("name", "")),
                    reason=str(term.get("reason", "")),
                    message=str(term.get("message", "")),
                    exit_code=code,
                    node=_map(pod.get("spec")).get("nodeName"),
                )
    return None


def outcome_of(trainjob: Mapping[str, Any], pods: Sequence[Mapping[str, Any]] = ()) -> Outcome:
    """The outcome of an incarnation as its TrainJob (and, if readable, its pods) show it now."""
    meta = _map(trainjob.get("metadata"))
    spec = _map(trainjob.get("spec"))
    conditions = _true_conditions(trainjob)
    if "Complete" in conditions:
        return Outcome(State.SUCCEEDED, Cause.NONE, (_evidence(trainjob, conditions["Complete"]),))
    if "Failed" in conditions:
        failed = conditions["Failed"]
        reason = failed.get("reason")
        if reason == "DeadlineExceeded":
            return Outcome(State.FAILED, Cause.TIMEOUT, (_evidence(trainjob, failed),))
        if reason == "TrainingRuntimeNotSupported":
            return Outcome(State.FAILED, Cause.INVALID_SPEC, (_evidence(trainjob, failed),))
        container = _failed_container(pods)
        if container is not None:
            return Outcome(State.FAILED, Cause.EXIT_CODE, (container, _evidence(trainjob, failed)))
        return Outcome(State.FAILED, Cause.UNKNOWN, (_evidence(trainjob, failed),))
    if meta.get("deletionTimestamp"):
        return Outcome(
            State.CANCELLED,
            Cause.CANCELLED,
            (_evidence(trainjob, reason="Deleting", message="the TrainJob is being deleted"),),
        )
    if spec.get("suspend") is True:
        if held_by_us(trainjob) is not None:  # our hold, not Kueue's queue
            return Outcome(State.HELD, Cause.NONE, (hold_evidence(trainjob),))
        queued = LABEL_QUEUE in _map(meta.get("labels"))
        suspended = conditions.get("Suspended")
        ev = (_evidence(trainjob, suspended) if suspended else _evidence(trainjob, reason="Suspended"),)
        return Outcome(State.QUEUED if queued else State.HELD, Cause.NONE, ev)
    nodes = _map(spec.get("trainer")).get("numNodes")
    want = nodes if isinstance(nodes, int) and nodes > 0 else 1
    live = [p for p in pods if not _map(p.get("metadata")).get("deletionTimestamp")]
    running = [p for p in live if _map(p.get("status")).get("phase") == "Running"]
    if len(running) >= want and len(running) == len(live):
        return Outcome(State.RUNNING, Cause.NONE)
    return Outcome(State.STARTING, Cause.NONE)


def lost(name: str) -> Outcome:
    """The TrainJob is gone and nothing says why."""
    return Outcome(
        State.LOST,
        Cause.UNKNOWN,
        (Evidence(kind="TrainJob", name=name, reason="NotFound", message="the TrainJob no longer exists"),),
    )


def cancelled(name: str) -> Outcome:
    """The TrainJob is gone after this backend deleted it."""
    return Outcome(
        State.CANCELLED,
        Cause.CANCELLED,
        (Evidence(kind="TrainJob", name=name, reason="Deleted", message="deleted by dispatch (stop)"),),
    )
