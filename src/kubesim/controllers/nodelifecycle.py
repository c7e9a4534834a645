"""The node lifecycle controller: a NotReady node's pods become not ready, and after the taint's
toleration time they are deleted (the taint manager)."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kubesim.clock import parse_rfc3339
from kubesim.controllers import conditions as cond
from kubesim.controllers.base import BaseController, Key
from kubesim.controllers.scheduler import tolerates
from kubesim.resources import NODES, PODS

if TYPE_CHECKING:
    from kubesim.store import WatchEvent

__all__ = ["NodeLifecycleController"]

_LIFECYCLE_TAINTS = ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")


class NodeLifecycleController(BaseController):
    """The taint manager: deletes pods from nodes with ``NoExecute`` taints they do not tolerate (at once,
    or after their ``tolerationSeconds``), marking them ``DisruptionTarget``/``DeletionByTaintManager``."""

    name = "node-lifecycle"

    def __init__(self) -> None:
        super().__init__()
        self._registered: set[str] = set()  # node uids this controller has seen

    def keys_for(self, ev: WatchEvent) -> Iterable[Key]:
        if ev.rt == NODES:
            yield ("", ev.obj["metadata"]["name"])
        elif ev.rt == PODS and (ev.obj.get("spec") or {}).get("nodeName") and ev.type == "ADDED":
            yield ("", str(ev.obj["spec"]["nodeName"]))

    def reconcile(self, namespace: str, name: str) -> None:
        node = self.get_or_none(NODES, None, name)
        if node is None:
            return
        uid = str(node["metadata"].get("uid"))
        if uid not in self._registered:
            # As the node lifecycle controller's first sight of a node (nodeutil.RecordNodeEvent).
            self._registered.add(uid)
            self.record_event(
                node,
                "Normal",
                "RegisteredNode",
                f"Node {name} event: Registered Node {name} in Controller",
                component="node-controller",
            )
        if not cond.is_true(node, "Ready"):
            self._mark_pods_not_ready(name)
        else:
            node = self._untaint(node)
        taints = [t for t in (node.get("spec") or {}).get("taints") or [] if t.get("effect") == "NoExecute"]
        if not taints:
            return
        pods, _ = self.store.list(PODS, field_selector=f"spec.nodeName={name}")
        now_s = self.clock.now()
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in (
                "Succeeded",
                "Failed",
            ):
                continue
            tolerations = list((pod.get("spec") or {}).get("tolerations") or [])
            evict_at: float | None = None
            for taint in taints:
                matching = [t for t in tolerations if tolerates([t], taint)]
                if not matching:
                    evict_at = now_s
                    break
                secs = [t.get("tolerationSeconds") for t in matching]
                if any(s is None for s in secs):
                    continue  # tolerated forever
                added = parse_rfc3339(taint["timeAdded"]) if taint.get("timeAdded") else now_s
                at = added + float(min(int(s) for s in secs if s is not None))
                evict_at = at if evict_at is None else min(evict_at, at)
            if evict_at is None:
                continue
            if now_s >= evict_at:
                before = copy.deepcopy(pod)
                cond.set_pod_condition(
                    pod,
                    "DisruptionTarget",
                    "True",
                    "DeletionByTaintManager",
                    "Taint manager: deleting due to NoExecute taint",
                    self.now(),
                )
                body = copy.deepcopy(before)
                body["status"] = pod["status"]
                self.store.update_status(PODS, body)
                self.store.delete(PODS, pod["metadata"].get("namespace"), pod["metadata"]["name"])
                self.record_event(
                    pod,
                    "Normal",
                    "TaintManagerEviction",
                    f"Marking for deletion Pod {pod['metadata'].get('namespace')}/{pod['metadata']['name']}",
                    component="taint-eviction-controller",
                )
            else:
                self.requeue_at(evict_at, None, name)

    def _untaint(self, node: dict[str, Any]) -> dict[str, Any]:
        """A node that is Ready again loses the taints this controller put on it (its NoSchedule and
        NoExecute tainting passes remove ``unreachable``/``not-ready`` once Ready is True), with the
        Event ``NodeReady`` (``RecordNodeStatusChange``)."""
        taints = (node.get("spec") or {}).get("taints") or []
        kept = [t for t in taints if t.get("key") not in _LIFECYCLE_TAINTS]
        if len(kept) == len(taints):
            return node
        after = copy.deepcopy(node)
        if kept:
            after["spec"]["taints"] = kept
        else:
            after["spec"].pop("taints", None)
        name = node["metadata"]["name"]
        out = self.write(NODES, node, after)
        self.record_event(
            out, "Normal", "NodeReady", f"Node {name} status is now: NodeReady", component="node-controller"
        )
        return out

    def _mark_pods_not_ready(self, node: str) -> None:
        # As the node lifecycle controller does for a node that stopped reporting: every pod on it turns
        # Ready=False at once (only the status changes), long before the taint manager deletes it.
        for pod in self.store.list(PODS, field_selector=f"spec.nodeName={node}")[0]:
            if not cond.is_true(pod, "Ready"):
                continue
            for c in pod["status"]["conditions"]:
                if c.get("type") == "Ready":
                    c.update(status="False", lastTransitionTime=self.now())
            self.store.update_status(PODS, pod)
