"""Outside disruptions for tests: preemption, eviction, OOM, exits, losing and restoring a node.

``sim.actions`` acts at once through the kubelet controller, as the component that would cause each
disruption on a real cluster (the scheduler's preemption, the eviction API, the kernel, a node going
away).
"""

from __future__ import annotations

import copy
from typing import Any

from kubesim.controllers import conditions as cond
from kubesim.controllers.kubelet import KubeletController
from kubesim.resources import NODES, PODS

__all__ = ["Actions"]


class Actions:
    """Direct cluster disruptions for tests (``sim.actions``); each acts at once, like the real component.

    - ``preempt(ns, pod)``: the scheduler preempts the pod (``DisruptionTarget``/``PreemptionByScheduler``,
      then a graceful delete).
    - ``evict(ns, pod)``: an Eviction API call (``DisruptionTarget``/``EvictionByEvictionAPI``, graceful delete).
    - ``node_pressure_evict(ns, pod, resource="memory")``: the kubelet evicts under node pressure: the pod
      fails with ``status.reason: Evicted`` and ``DisruptionTarget``/``TerminationByKubelet`` (not deleted).
    - ``oom(ns, pod)``: the main container is OOM-killed (exit 137, ``OOMKilled``).
    - ``exit(ns, pod, code)``: the main container exits with ``code`` now.
    - ``lose_node(node)``: the node stops reporting (``Ready=Unknown``, unreachable taints); its pods are
      deleted by the taint manager (``DeletionByTaintManager``) once their toleration runs out (300 s by
      default).
    - ``restore_node(node)``: the node comes back (Ready; the node lifecycle controller then removes the
      taints).
    """

    def __init__(self, kubelet: KubeletController) -> None:
        self._k = kubelet

    def _pod(self, ns: str, pod: str) -> dict[str, Any]:
        return self._k.store.get(PODS, ns, pod)

    def _disrupt(self, ns: str, pod: str, reason: str, message: str) -> None:
        obj = self._pod(ns, pod)
        before = copy.deepcopy(obj)
        cond.set_pod_condition(obj, "DisruptionTarget", "True", reason, message, self._k.now())
        body = copy.deepcopy(before)
        body["status"] = obj["status"]
        self._k.store.update_status(PODS, body)
        self._k.store.delete(PODS, ns, pod)

    def preempt(self, ns: str, pod: str) -> None:
        obj = self._pod(ns, pod)
        self._disrupt(
            ns,
            pod,
            "PreemptionByScheduler",
            "default-scheduler: preempting to accommodate a higher priority pod",
        )
        self._k.record_event(
            obj,
            "Normal",
            "Preempted",
            "Preempted by pod on node " + str((obj.get("spec") or {}).get("nodeName")),
            component="default-scheduler",
        )

    def evict(self, ns: str, pod: str) -> None:
        self._disrupt(ns, pod, "EvictionByEvictionAPI", "Eviction API: evicting")

    def node_pressure_evict(self, ns: str, pod: str, resource: str = "memory") -> None:
        obj = self._pod(ns, pod)
        run = self._k.runs.get(obj["metadata"]["uid"])
        message = f"The node was low on resource: {resource}. Threshold quantity: 100Mi, available: 10Mi. "
        before = copy.deepcopy(obj)
        now = self._k.now()
        cond.set_pod_condition(obj, "DisruptionTarget", "True", "TerminationByKubelet", message, now)
        if run is not None and run.mode != "done":
            self._k._stop_process(run)
            run.state = self._k._terminated(run, 137, "Error")
            run.ready = False
            run.mode = "done"
            run.phase = "Failed"
            self._k.logs.close(run.ns, run.name, run.main)
            self._k._publish(run)
            obj = self._pod(ns, pod)
            before = copy.deepcopy(obj)
            cond.set_pod_condition(obj, "DisruptionTarget", "True", "TerminationByKubelet", message, now)
        obj["status"]["phase"] = "Failed"
        obj["status"]["reason"] = "Evicted"
        obj["status"]["message"] = message
        body = copy.deepcopy(before)
        body["status"] = obj["status"]
        self._k.store.update_status(PODS, body)
        self._k.record_event(obj, "Warning", "Evicted", message, component="kubelet")

    def _kill(self, ns: str, pod: str, code: int, reason: str) -> None:
        obj = self._pod(ns, pod)
        run = self._k.runs.get(obj["metadata"]["uid"])
        if run is None or run.mode != "running":
            raise ValueError(f"pod {ns}/{pod} has no running container to end (is it scheduled and started?)")
        self._k._exit(obj, run, code, reason)
        self._k._publish(run)

    def oom(self, ns: str, pod: str) -> None:
        self._kill(ns, pod, 137, "OOMKilled")

    def exit(self, ns: str, pod: str, code: int) -> None:
        self._kill(ns, pod, code, "Completed" if code == 0 else "Error")

    def lose_node(self, node: str) -> None:
        store = self._k.store
        obj = store.get(NODES, None, node)
        now = self._k.now()
        before = copy.deepcopy(obj)
        taints = [
            t
            for t in (obj.get("spec") or {}).get("taints") or []
            if t.get("key") != "node.kubernetes.io/unreachable"
        ]
        taints.append({"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule", "timeAdded": now})
        taints.append({"key": "node.kubernetes.io/unreachable", "effect": "NoExecute", "timeAdded": now})
        obj.setdefault("spec", {})["taints"] = taints
        obj = self._k.write(NODES, before, obj)
        before = copy.deepcopy(obj)
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Ready":
                c.update(
                    status="Unknown",
                    reason="NodeStatusUnknown",
                    message="Kubelet stopped posting node status.",
                    lastTransitionTime=now,
                )
        self._k.write(NODES, before, obj)
        self._k.dead_nodes.add(node)
        self._k.lose_processes(node)
        self._k.record_event(
            obj,
            "Normal",
            "NodeNotReady",
            f"Node {node} status is now: NodeNotReady",
            component="node-controller",
        )

    def restore_node(self, node: str) -> None:
        """The machine is back: its kubelet posts ``Ready`` again and runs its pods; the node lifecycle
        controller removes the ``unreachable`` taints when it next sees the node (on the next settle)."""
        store = self._k.store
        obj = store.get(NODES, None, node)
        before = copy.deepcopy(obj)
        for c in (obj.get("status") or {}).get("conditions") or []:
            if c.get("type") == "Ready" and c.get("status") != "True":
                c.update(
                    status="True",
                    reason="KubeletReady",
                    message="kubelet is posting ready status",
                    lastTransitionTime=self._k.now(),
                )
        self._k.write(NODES, before, obj)
        self._k.dead_nodes.discard(node)
        for pod in store.list(PODS, field_selector=f"spec.nodeName={node}")[0]:
            self._k.enqueue(pod["metadata"].get("namespace"), pod["metadata"]["name"])  # its kubelet is back
