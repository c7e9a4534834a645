"""Server-side tables (``meta.k8s.io/v1`` Table), what ``kubectl get`` asks for to print its columns.

Columns follow the real printers (pods: Ready/Status/Restarts/Age, ...) and the upstream CRDs'
additionalPrinterColumns (TrainJob: State; JobSet: TerminalState/Restarts/Completed/Suspended; Kueue).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kubesim.clock import parse_rfc3339
from kubesim.resources import ResourceType

__all__ = ["human_duration", "table", "wants_table"]

Column = tuple[str, str, int, Callable[[dict[str, Any], float], Any]]  # name, type, priority, cell


def wants_table(accept: str | None) -> bool:
    """Whether an Accept header asks for a Table (``application/json;as=Table;v=v1;g=meta.k8s.io``)."""
    return bool(accept) and "as=Table" in (accept or "") and "g=meta.k8s.io" in (accept or "")


def human_duration(seconds: float) -> str:
    """Kubernetes' short human duration (``5s``, ``3m20s``, ``5h``, ``3d4h``, ``2y``)."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    if h < 24 * 8:
        return f"{h // 24}d{h % 24}h" if h % 24 else f"{h // 24}d"
    if h < 24 * 365 * 2:
        return f"{h // 24}d"
    if h < 24 * 365 * 8:
        d = h // 24 % 365
        return f"{h // 24 // 365}y{d}d" if d else f"{h // 24 // 365}y"
    return f"{h // 24 // 365}y"


def _age(obj: dict[str, Any], now: float) -> str:
    ts = obj.get("metadata", {}).get("creationTimestamp")
    if not ts:
        return "<unknown>"
    return human_duration(now - parse_rfc3339(ts))


def _get(obj: Any, *path: str) -> Any:
    for p in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(p)
    return obj


def _condition(obj: dict[str, Any], ctype: str) -> str:
    for c in _get(obj, "status", "conditions") or []:
        if c.get("type") == ctype:
            return str(c.get("status", ""))
    return ""


def _pod_status(pod: dict[str, Any]) -> str:
    status = pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Pending"
    # printPod: a PodScheduled condition with reason SchedulingGated shows as that reason
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("reason") == "SchedulingGated":
            reason = "SchedulingGated"
    for cs in reversed(status.get("containerStatuses") or []):
        state = cs.get("state") or {}
        if (state.get("waiting") or {}).get("reason"):
            reason = state["waiting"]["reason"]
        elif "terminated" in state:
            t = state["terminated"] or {}
            if t.get("reason"):
                reason = t["reason"]
            elif t.get("signal"):
                reason = f"Signal:{t['signal']}"
            else:
                reason = f"ExitCode:{t.get('exitCode', 0)}"
    if pod.get("metadata", {}).get("deletionTimestamp"):
        reason = "Unknown" if status.get("reason") == "NodeLost" else "Terminating"
    return str(reason)


def _pod_ready(pod: dict[str, Any]) -> str:
    statuses = _get(pod, "status", "containerStatuses") or []
    total = len(_get(pod, "spec", "containers") or [])
    return f"{sum(1 for c in statuses if c.get('ready'))}/{total}"


def _node_status(node: dict[str, Any]) -> str:
    ready = _condition(node, "Ready")
    out = "Ready" if ready == "True" else "NotReady" if ready else "Unknown"
    if _get(node, "spec", "unschedulable"):
        out += ",SchedulingDisabled"
    return out


def _job_status(job: dict[str, Any]) -> str:
    for ctype, label in (("Complete", "Complete"), ("Failed", "Failed"), ("Suspended", "Suspended")):
        if _condition(job, ctype) == "True":
            return label
    return "Running"


def _last_condition_type(obj: dict[str, Any]) -> str:
    conds = _get(obj, "status", "conditions") or []
    return str(conds[-1].get("type", "")) if conds else ""


_NAME: Column = ("Name", "string", 0, lambda o, now: o["metadata"]["name"])
_AGE: Column = ("Age", "date", 0, _age)

_COLUMNS: dict[tuple[str, str], list[Column]] = {
    ("", "pods"): [
        _NAME,
        ("Ready", "string", 0, lambda o, now: _pod_ready(o)),
        ("Status", "string", 0, lambda o, now: _pod_status(o)),
        (
            "Restarts",
            "string",
            0,
            lambda o, now: str(
                sum(int(c.get("restartCount", 0)) for c in _get(o, "status", "containerStatuses") or [])
            ),
        ),
        _AGE,
        ("IP", "string", 1, lambda o, now: _get(o, "status", "podIP") or "<none>"),
        ("Node", "string", 1, lambda o, now: _get(o, "spec", "nodeName") or "<none>"),
    ],
    ("", "nodes"): [
        _NAME,
        ("Status", "string", 0, lambda o, now: _node_status(o)),
        ("Roles", "string", 0, lambda o, now: "<none>"),
        _AGE,
        ("Version", "string", 0, lambda o, now: _get(o, "status", "nodeInfo", "kubeletVersion") or ""),
    ],
    ("", "namespaces"): [
        _NAME,
        ("Status", "string", 0, lambda o, now: _get(o, "status", "phase") or ""),
        _AGE,
    ],
    ("", "configmaps"): [
        _NAME,
        ("Data", "integer", 0, lambda o, now: len(o.get("data") or {}) + len(o.get("binaryData") or {})),
        _AGE,
    ],
    ("", "events"): [
        (
            "Last Seen",
            "string",
            0,
            lambda o, now: human_duration(
                now
                - parse_rfc3339(
                    o.get("lastTimestamp") or o.get("eventTime") or o["metadata"]["creationTimestamp"]
                )
            ),
        ),
        ("Type", "string", 0, lambda o, now: o.get("type", "")),
        ("Reason", "string", 0, lambda o, now: o.get("reason", "")),
        (
            "Object",
            "string",
            0,
            lambda o, now: (
                f"{str(_get(o, 'involvedObject', 'kind') or '').lower()}/{_get(o, 'involvedObject', 'name') or ''}"
            ),
        ),
        ("Message", "string", 0, lambda o, now: o.get("message", "")),
    ],
    ("batch", "jobs"): [
        _NAME,
        ("Status", "string", 0, lambda o, now: _job_status(o)),
        (
            "Completions",
            "string",
            0,
            lambda o, now: f"{_get(o, 'status', 'succeeded') or 0}/{_get(o, 'spec', 'completions') or 1}",
        ),
        _AGE,
    ],
    ("trainer.kubeflow.org", "trainjobs"): [
        _NAME,
        ("State", "string", 0, lambda o, now: _last_condition_type(o)),
        _AGE,
    ],
    ("jobset.x-k8s.io", "jobsets"): [
        _NAME,
        ("TerminalState", "string", 0, lambda o, now: _get(o, "status", "terminalState") or ""),
        ("Restarts", "string", 0, lambda o, now: str(_get(o, "status", "restarts") or 0)),
        ("Completed", "string", 0, lambda o, now: _condition(o, "Completed")),
        ("Suspended", "string", 0, lambda o, now: str(bool(_get(o, "spec", "suspend"))).lower()),
        _AGE,
    ],
    ("kueue.x-k8s.io", "workloads"): [
        _NAME,
        ("Queue", "string", 0, lambda o, now: _get(o, "spec", "queueName") or ""),
        ("Reserved in", "string", 0, lambda o, now: _get(o, "status", "admission", "clusterQueue") or ""),
        ("Admitted", "string", 0, lambda o, now: _condition(o, "Admitted")),
        ("Finished", "string", 0, lambda o, now: _condition(o, "Finished")),
        _AGE,
    ],
    ("kueue.x-k8s.io", "localqueues"): [
        _NAME,
        ("ClusterQueue", "string", 0, lambda o, now: _get(o, "spec", "clusterQueue") or ""),
        ("Pending Workloads", "integer", 0, lambda o, now: _get(o, "status", "pendingWorkloads") or 0),
        ("Admitted Workloads", "integer", 0, lambda o, now: _get(o, "status", "admittedWorkloads") or 0),
    ],
    ("kueue.x-k8s.io", "clusterqueues"): [
        _NAME,
        (
            "Cohort",
            "string",
            0,
            lambda o, now: _get(o, "spec", "cohortName") or _get(o, "spec", "cohort") or "",
        ),
        ("Pending Workloads", "integer", 0, lambda o, now: _get(o, "status", "pendingWorkloads") or 0),
        ("Admitted Workloads", "integer", 0, lambda o, now: _get(o, "status", "admittedWorkloads") or 0),
    ],
}


def _columns(rt: ResourceType) -> list[Column]:
    return _COLUMNS.get((rt.group, rt.plural), [_NAME, _AGE])


def _partial(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj.get("metadata", {}).items() if k != "managedFields"}
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": meta}


def table(
    rt: ResourceType,
    objs: list[dict[str, Any]],
    now: float,
    *,
    resource_version: str,
    include_object: str = "Metadata",
    list_meta: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A Table of ``objs`` (``include_object``: ``None``, ``Metadata`` (default) or ``Object``)."""
    cols = _columns(rt)
    rows = []
    for o in objs:
        row: dict[str, Any] = {"cells": [fn(o, now) for _, _, _, fn in cols]}
        if include_object == "Object":
            row["object"] = o
        elif include_object != "None":
            row["object"] = _partial(o)
        rows.append(row)
    meta = dict(list_meta or {})
    meta["resourceVersion"] = resource_version
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta,
        "columnDefinitions": [
            {
                "name": name,
                "type": typ,
                "format": "name" if name == "Name" else "",
                "description": "",
                "priority": prio,
            }
            for name, typ, prio, _ in cols
        ],
        "rows": rows,
    }
