"""A kube-scheduler stand-in: binds pending pods to simulated Nodes.

Filters as the default plugins do (node Ready/unschedulable, taints and tolerations, nodeSelector and
required node affinity, requested resources vs allocatable), scores by least allocated, and reports
``PodScheduled=False``: ``SchedulingGated`` while a pod has scheduling gates (it is never bound then),
``Unschedulable`` with the scheduler's message (``0/4 nodes are available: 4 Insufficient cpu.
preemption: ...``) plus a ``FailedScheduling`` Event.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kubesim.controllers import conditions as cond
from kubesim.controllers.base import BaseController, Key
from kubesim.controllers.quantity import parse_quantity, pod_requests
from kubesim.controllers.volumes import SELECTED_NODE, claim_names, scheduling_problem
from kubesim.resources import NODES, PERSISTENTVOLUMECLAIMS, PODS, STORAGECLASSES

if TYPE_CHECKING:
    from kubesim.store import WatchEvent

__all__ = ["SchedulerController", "fit_reasons", "tolerates", "unschedulable_message"]

GATED_MSG = "Scheduling is blocked due to non-empty scheduling gates"
_SCORE_CPU, _SCORE_MEM = "<score-cpu>", "<score-memory>"
DEFAULT_CPU_SCORE = 0.1  # the scheduler scores a container without requests as 100m CPU ...
DEFAULT_MEM_SCORE = 200.0 * 2**20  # ... and 200Mi memory


def _add_usage(u: dict[str, float], pod_spec: dict[str, Any]) -> None:
    req = pod_requests(pod_spec)
    for k, v in req.items():
        u[k] = u.get(k, 0.0) + v
    n = max(1, len(pod_spec.get("containers") or []))
    u[_SCORE_CPU] = u.get(_SCORE_CPU, 0.0) + max(req.get("cpu", 0.0), DEFAULT_CPU_SCORE * n)
    u[_SCORE_MEM] = u.get(_SCORE_MEM, 0.0) + max(req.get("memory", 0.0), DEFAULT_MEM_SCORE * n)


def tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    """Whether a taint is tolerated (operator Exists/Equal, empty key with Exists tolerates all)."""
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator", "Equal")
        if not t.get("key") and op == "Exists":
            return True
        if t.get("key") != taint.get("key"):
            continue
        if op == "Exists" or str(t.get("value", "")) == str(taint.get("value", "")):
            return True
    return False


def _match_expr(labels: dict[str, str], expr: dict[str, Any]) -> bool:
    key, op, values = expr.get("key"), expr.get("operator"), [str(v) for v in expr.get("values") or []]
    present = key in labels
    if op == "In":
        return present and labels[str(key)] in values
    if op == "NotIn":
        return not present or labels[str(key)] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and values:
        try:
            a, b = float(labels[str(key)]), float(values[0])
        except ValueError:
            return False
        return a > b if op == "Gt" else a < b
    return False


def _selector_ok(pod_spec: dict[str, Any], labels: dict[str, str]) -> bool:
    for k, v in (pod_spec.get("nodeSelector") or {}).items():
        if labels.get(k) != str(v):
            return False
    required = (
        ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms")
    if required:
        return any(
            all(_match_expr(labels, e) for e in term.get("matchExpressions") or []) for term in required
        )
    return True


def _node_ready(node: dict[str, Any]) -> bool:
    return cond.is_true(node, "Ready")


def fit_reasons(
    pod_spec: dict[str, Any], node: dict[str, Any], used: dict[str, float]
) -> tuple[list[str], bool]:
    """Why ``pod_spec`` does not fit ``node`` (empty if it fits), and whether preemption could help."""
    spec = node.get("spec") or {}
    if spec.get("unschedulable"):
        return ["node(s) were unschedulable"], False
    tolerations = list(pod_spec.get("tolerations") or [])
    for taint in spec.get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerates(tolerations, taint):
            return [f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value', '')}}}"], False
    if not _selector_ok(pod_spec, (node.get("metadata") or {}).get("labels") or {}):
        return ["node(s) didn't match Pod's node affinity/selector"], False
    allocatable = (
        (node.get("status") or {}).get("allocatable") or (node.get("status") or {}).get("capacity") or {}
    )
    reasons = []
    for res, want in sorted(pod_requests(pod_spec).items()):
        if want <= 0:
            continue
        have = parse_quantity(allocatable.get(res, 0)) - used.get(res, 0.0)
        if want > have + 1e-9:
            reasons.append("Too many pods" if res == "pods" else f"Insufficient {res}")
    return reasons, True


def unschedulable_message(n_nodes: int, per_node: list[tuple[list[str], bool]]) -> str:
    """The scheduler's FitError text plus the preemption post-filter's summary."""
    counts: dict[str, int] = {}
    for reasons, _ in per_node:
        for r in reasons:
            counts[r] = counts.get(r, 0) + 1
    parts = sorted(f"{v} {k}" for k, v in counts.items())
    msg = f"0/{n_nodes} nodes are available"
    msg += f": {', '.join(parts)}." if parts else "."
    helpful = sum(1 for reasons, resource_only in per_node if resource_only)
    post: dict[str, int] = {}
    if helpful:
        post["No preemption victims found for incoming pod."] = helpful
    if n_nodes - helpful:
        post["Preemption is not helpful for scheduling."] = n_nodes - helpful
    if n_nodes:
        msg += f" preemption: 0/{n_nodes} nodes are available: " + ", ".join(
            sorted(f"{v} {k}" for k, v in post.items())
        )
    return msg


class SchedulerController(BaseController):
    """Binds pods to nodes, or explains why it cannot."""

    name = "scheduler"
    cached_kinds = (PODS, NODES)

    def resync(self) -> None:
        for pod in self.cached(PODS):
            if not (pod.get("spec") or {}).get("nodeName"):
                self._unbound.add((pod["metadata"].get("namespace", ""), pod["metadata"]["name"]))
                self.enqueue(pod["metadata"].get("namespace"), pod["metadata"]["name"])

    def __init__(self) -> None:
        super().__init__()
        self._unbound: set[Key] = set()  # pods not yet bound to a node

    def keys_for(self, ev: WatchEvent) -> Iterable[Key]:
        if ev.rt == PODS:
            spec = ev.obj.get("spec") or {}
            pkey = (ev.obj["metadata"].get("namespace", ""), ev.obj["metadata"]["name"])
            if ev.type != "DELETED" and not spec.get("nodeName"):
                self._unbound.add(pkey)
            else:
                self._unbound.discard(pkey)
            if not spec.get("nodeName") and ev.type != "DELETED":
                yield (ev.obj["metadata"].get("namespace", ""), ev.obj["metadata"]["name"])
            elif spec.get("nodeName") and (
                ev.type == "DELETED" or (ev.obj.get("status") or {}).get("phase") in ("Succeeded", "Failed")
            ):
                yield ("", "*")  # capacity was freed: retry every pending pod
        elif ev.rt in (NODES, PERSISTENTVOLUMECLAIMS):
            yield ("", "*")

    def reconcile(self, namespace: str, name: str) -> None:
        if name == "*" and not namespace:
            if not self._unbound:
                return
            pending = [p for k in self._unbound if (p := self.cached_get(PODS, k[0], k[1])) is not None]
            pending.sort(
                key=lambda p: (
                    -int((p.get("spec") or {}).get("priority") or 0),
                    p["metadata"].get("creationTimestamp", ""),
                )
            )
            used = self._usage()
            nodes = sorted(self.cached(NODES), key=lambda n: n["metadata"]["name"])
            for p in pending:
                self._schedule(p, used, nodes)
            return
        pod = self.get_or_none(PODS, namespace, name)
        if pod is not None:
            self._schedule(
                pod, self._usage(), sorted(self.cached(NODES), key=lambda n: n["metadata"]["name"])
            )

    def _usage(self) -> dict[str, dict[str, float]]:
        used: dict[str, dict[str, float]] = {}
        for p in self.cached(PODS):
            node = (p.get("spec") or {}).get("nodeName")
            if not node or (p.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            _add_usage(used.setdefault(node, {}), p.get("spec") or {})
        return used

    def _schedule(
        self, pod: dict[str, Any], used: dict[str, dict[str, float]], nodes: list[dict[str, Any]]
    ) -> None:
        spec = pod.get("spec") or {}
        meta = pod["metadata"]
        if spec.get("nodeName") or meta.get("deletionTimestamp"):
            return
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return
        ns, name = meta.get("namespace"), meta["name"]
        pod = copy.deepcopy(pod)  # cached objects are read-only
        before = copy.deepcopy(pod)
        now = self.now()
        if spec.get("schedulingGates"):
            cond.set_pod_condition(pod, "PodScheduled", "False", "SchedulingGated", GATED_MSG, now)
            self._write_status(before, pod)
            return
        volumes = scheduling_problem(
            pod,
            lambda claim: self.get_or_none(PERSISTENTVOLUMECLAIMS, ns, claim),
            lambda cls: self.get_or_none(STORAGECLASSES, None, cls) if cls else None,
        )
        if volumes is not None:
            # VolumeBinding's PreFilter rejects the pod for every node at once.
            n = len(nodes)
            msg = (
                f"0/{n} nodes are available: {volumes}. preemption: 0/{n} nodes are available: "
                f"{n} Preemption is not helpful for scheduling."
            )
            self._unschedulable(before, pod, msg, now)
            return
        per_node: list[tuple[list[str], bool]] = []
        best: tuple[float, str] | None = None
        for node in nodes:
            nname = node["metadata"]["name"]
            reasons, resource_only = fit_reasons(spec, node, used.get(nname, {}))
            if not _node_ready(node) and not reasons:
                reasons, resource_only = (
                    ["node(s) had untolerated taint {node.kubernetes.io/not-ready: }"],
                    False,
                )
            per_node.append((reasons, resource_only))
            if reasons:
                continue
            alloc = (node.get("status") or {}).get("allocatable") or {}
            cpu = parse_quantity(alloc.get("cpu", 1)) or 1.0
            mem = parse_quantity(alloc.get("memory", 1)) or 1.0
            u = used.get(nname, {})
            # LeastAllocated over the non-zero requests the scheduler scores with, so pods spread.
            load = (u.get(_SCORE_CPU, 0.0) / cpu + u.get(_SCORE_MEM, 0.0) / mem) / 2
            if best is None or (load, nname) < best:
                best = (load, nname)
        if best is None:
            self._unschedulable(before, pod, unschedulable_message(len(nodes), per_node), now)
            return
        node_name = best[1]
        self._select_node_for_claims(pod, node_name)
        _add_usage(used.setdefault(node_name, {}), spec)
        bound = copy.deepcopy(before)
        bound["spec"]["nodeName"] = node_name
        cond.set_pod_condition(bound, "PodScheduled", "True", "", "", now)
        bound = self.store.bind(PODS, bound)
        self.record_event(
            bound,
            "Normal",
            "Scheduled",
            f"Successfully assigned {ns}/{name} to {node_name}",
            component="default-scheduler",
        )

    def _unschedulable(self, before: dict[str, Any], pod: dict[str, Any], msg: str, now: str) -> None:
        old = cond.find(pod, "PodScheduled") or {}
        cond.set_pod_condition(pod, "PodScheduled", "False", "Unschedulable", msg, now)
        if old.get("message") != msg:
            self.record_event(pod, "Warning", "FailedScheduling", msg, component="default-scheduler")
        self._write_status(before, pod)

    def _select_node_for_claims(self, pod: dict[str, Any], node: str) -> None:
        """VolumeBinding's PreBind for unbound WaitForFirstConsumer claims: ``selected-node``, which the
        provisioner waits for (the PV controller provisions in the same settle round)."""
        ns = pod["metadata"].get("namespace")
        for claim in claim_names(pod):
            pvc = self.get_or_none(PERSISTENTVOLUMECLAIMS, ns, claim)
            if pvc is None or (pvc.get("status") or {}).get("phase") == "Bound":
                continue
            if SELECTED_NODE not in (pvc["metadata"].get("annotations") or {}):
                self.store.mutate(
                    PERSISTENTVOLUMECLAIMS,
                    ns,
                    claim,
                    lambda o: o["metadata"].setdefault("annotations", {}).__setitem__(SELECTED_NODE, node),
                )

    def _write_status(self, before: dict[str, Any], after: dict[str, Any]) -> None:
        if before.get("status") != after.get("status"):
            body = copy.deepcopy(before)
            body["status"] = after["status"]
            self.store.update_status(PODS, body)
