"""Nodes that come back: what happens to a lost machine some time later, outside Kubernetes.

- ``reboot``: the machine restarts and its kubelet posts ``Ready`` again (``Actions.restore_node``); the
  node lifecycle controller then removes the ``unreachable`` taints (nodelifecycle.py).
- ``replace``: a cluster autoscaler gives up on it and brings a new machine: the old Node is deleted
  (PodGC force-deletes the pods still bound to it, ``DisruptionTarget``/``DeletionByPodGC`` "PodGC: node
  no longer exists", as ``pkg/controller/podgc`` does for orphaned pods), and a new Node with the same
  capacity and labels, under the next free name, registers.

Off unless the simulator's ``node_recovery`` is ``"reboot"`` or ``"replace"``; ``node_recovery_after``
seconds count from the moment the node stopped being Ready.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kubesim.clock import parse_rfc3339
from kubesim.controllers import conditions as cond
from kubesim.controllers.base import BaseController, Key
from kubesim.errors import ApiError
from kubesim.fixtures import make_node
from kubesim.resources import NODES, PODS

if TYPE_CHECKING:
    from kubesim.store import WatchEvent

__all__ = ["RECOVERY_MODES", "NodeRecoveryController", "replacement_name"]

RECOVERY_MODES = ("reboot", "replace")
_NUMBERED = re.compile(r"^(.*?)(\d+)$")


def replacement_name(lost: str, existing: Iterable[str]) -> str:
    """The name of the machine that replaces ``lost``: its prefix with the next number not in use
    (``node-1`` with ``node-0..3`` → ``node-4``), or ``<lost>-1``, ``-2``, ... without a number."""
    taken = set(existing)
    m = _NUMBERED.match(lost)
    prefix = m.group(1) if m else f"{lost}-"
    numbers = [int(n.group(2)) for n in map(_NUMBERED.match, taken) if n and n.group(1) == prefix]
    i = max(numbers, default=0) + 1
    while f"{prefix}{i}" in taken:
        i += 1
    return f"{prefix}{i}"


class NodeRecoveryController(BaseController):
    """Reboots or replaces a lost node ``node_recovery_after`` seconds after it stopped being Ready."""

    name = "node-recovery"

    def keys_for(self, ev: WatchEvent) -> Iterable[Key]:
        if ev.rt == NODES and ev.type != "DELETED":
            yield ("", ev.obj["metadata"]["name"])

    def resync(self) -> None:
        for node in self.store.list(NODES)[0]:
            self.enqueue(None, node["metadata"]["name"])

    def reconcile(self, namespace: str, name: str) -> None:
        mode = getattr(self.sim, "node_recovery", None)
        if mode not in RECOVERY_MODES:
            return
        node = self.get_or_none(NODES, None, name)
        ready = cond.find(node, "Ready") if node is not None else None
        if node is None or ready is None or ready.get("status") == "True":
            return
        since = ready.get("lastTransitionTime")
        lost_at = parse_rfc3339(since) if since else self.clock.now()
        due = lost_at + float(getattr(self.sim, "node_recovery_after", 60.0))
        if self.clock.now() < due:
            self.requeue_at(due, None, name)
            return
        if mode == "reboot":
            self.sim.actions.restore_node(name)
        else:
            self._replace(node)

    def _replace(self, node: dict[str, Any]) -> None:
        name = node["metadata"]["name"]
        for pod in self.store.list(PODS, field_selector=f"spec.nodeName={name}")[0]:
            self._collect_orphan(pod)
        try:
            self.store.delete(NODES, None, name)
        except ApiError as e:
            if e.code != 404:
                raise
        names = [n["metadata"]["name"] for n in self.store.list(NODES)[0]]
        new_name = replacement_name(name, [*names, name])
        labels = {
            k: v for k, v in (node["metadata"].get("labels") or {}).items() if k != "kubernetes.io/hostname"
        }
        numbered = _NUMBERED.match(new_name)
        index = int(numbered.group(2)) if numbered else len(names)
        capacity = dict((node.get("status") or {}).get("capacity") or {})
        self.store.create(NODES, make_node(new_name, capacity or None, labels=labels, index=index))

    def _collect_orphan(self, pod: dict[str, Any]) -> None:
        """PodGC for a pod whose node is gone: ``DisruptionTarget`` (unless it has one), then a force
        delete."""
        meta = pod["metadata"]
        ns, pname = meta.get("namespace", ""), meta["name"]
        if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            before = copy.deepcopy(pod)
            status = pod.setdefault("status", {})
            status["phase"] = "Failed"
            if not cond.is_true(pod, "DisruptionTarget"):
                reason, message = "DeletionByPodGC", "PodGC: node no longer exists"
                cond.set_pod_condition(pod, "DisruptionTarget", "True", reason, message, self.now())
            body = copy.deepcopy(before)
            body["status"] = status
            self.store.update_status(PODS, body)
        self.store.force_delete(ns, pname)
