"""Output of an incarnation's nodes (SPEC §9.6): the ``node`` container's log of node *i*.

Node *i* is the pod of the incarnation whose ``batch.kubernetes.io/job-completion-index`` is *i* (the
rank); when a Job replaced a pod, the newest one that is not being deleted is read, else the newest. With
``follow`` a node whose pod is not there or has not started yet is waited for with a watch on its pods (not
by polling), then its log is streamed until the container ends. ``previous`` reads the last terminated
container of a pod that restarted in place.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from dispatch.errors import BusyError, InvalidError, NotFoundError, OutcomeUnknownError, UnavailableError
from dispatch.model import Identity
from dispatch_kubeflow.errors import ExpiredError, map_status
from dispatch_kubeflow.kube import KubeClient
from dispatch_kubeflow.names import NODE_CONTAINER
from dispatch_kubeflow.naming import identity_labels
from dispatch_kubeflow.objects import as_map
from dispatch_kubeflow.resources import PODS

__all__ = [
    "LABEL_INDEX",
    "LABEL_REPLICATED_JOB",
    "Pods",
    "incarnation_pods",
    "node_pod",
    "read_tail",
    "stream_output",
]

_log = logging.getLogger(__name__)

LABEL_INDEX = "batch.kubernetes.io/job-completion-index"
LABEL_REPLICATED_JOB = "jobset.sigs.k8s.io/replicatedjob-name"
_WAIT_SECONDS = 60  # one watch request while following a node that has not started


def _selector(identity: Identity, node: int | None = None) -> str:
    sel = ",".join(f"{k}={v}" for k, v in identity_labels(identity).items())
    return sel if node is None else f"{sel},{LABEL_INDEX}={node}"


def _has_node_container(pod: Mapping[str, Any]) -> bool:
    containers = as_map(pod.get("spec")).get("containers")
    return isinstance(containers, list) and any(as_map(c).get("name") == NODE_CONTAINER for c in containers)


def node_pod(pods: Sequence[Mapping[str, Any]], node: int) -> Mapping[str, Any] | None:
    """The pod of node ``node`` among an incarnation's pods (see the module docstring)."""
    mine = [
        p
        for p in pods
        if as_map(as_map(p.get("metadata")).get("labels")).get(LABEL_INDEX) == str(node)
        and _has_node_container(p)
    ]
    if not mine:
        return None

    def rank(p: Mapping[str, Any]) -> tuple[bool, bool, str]:
        meta = as_map(p.get("metadata"))
        # the trainer's own replicated job ("node") first, live pods before deleting ones, newest last
        return (
            as_map(meta.get("labels")).get(LABEL_REPLICATED_JOB) == NODE_CONTAINER,
            not meta.get("deletionTimestamp"),
            str(meta.get("creationTimestamp", "")),
        )

    return max(mine, key=rank)


def _started(pod: Mapping[str, Any]) -> bool:
    """Whether the node container has a log to read (it runs or ran)."""
    statuses = as_map(pod.get("status")).get("containerStatuses")
    for cs in statuses if isinstance(statuses, list) else []:
        cs = as_map(cs)
        if cs.get("name") == NODE_CONTAINER:
            state = as_map(cs.get("state"))
            return "running" in state or "terminated" in state or "terminated" in as_map(cs.get("lastState"))
    return False


def _log_path(namespace: str, pod: str) -> str:
    return PODS.path(namespace, pod, "log")


def _time_params(since: float | None, timestamps: bool) -> dict[str, str]:
    """The kubelet's ``sinceSeconds`` (whole seconds, at least 1) and ``timestamps``, when asked for."""
    params = {}
    if since is not None:
        params["sinceSeconds"] = str(max(1, math.ceil(since)))
    if timestamps:
        params["timestamps"] = "true"
    return params


async def read_tail(
    client: KubeClient,
    namespace: str,
    pod: str,
    *,
    lines: int | None,
    previous: bool = False,
    since: float | None = None,
    timestamps: bool = False,
) -> tuple[str, ...]:
    """The last ``lines`` lines (all with ``None``) of the ``node`` container of ``pod``; raises dispatch's
    errors (the caller decides what a missing log means)."""
    params = {"container": NODE_CONTAINER, **_time_params(since, timestamps)}
    if lines is not None:
        params["tailLines"] = str(lines)
    if previous:
        params["previous"] = "true"
    text = await client.request(
        "GET", _log_path(namespace, pod), what=f'read the log of pod "{pod}"', params=params, accept_text=True
    )
    return tuple(text.splitlines()) if isinstance(text, str) else ()


Pods = tuple[list[dict[str, Any]], str]
"""Pods of an incarnation as one listing gave them, and that listing's resourceVersion."""


async def incarnation_pods(client: KubeClient, namespace: str, identity: Identity) -> Pods:
    """Every pod of the incarnation (all its nodes), in one listing."""
    return await _pods(client, namespace, _selector(identity), what="list the pods of an incarnation")


async def _pods(
    client: KubeClient, namespace: str, selector: str, what: str = "list the pods of a node"
) -> Pods:
    out = await client.request("GET", PODS.path(namespace), what=what, params={"labelSelector": selector})
    out = out if isinstance(out, dict) else {}
    items = out.get("items")
    rv = as_map(out.get("metadata")).get("resourceVersion")
    return (
        [i for i in items if isinstance(i, dict)] if isinstance(items, list) else [],
        rv if isinstance(rv, str) else "",
    )


async def _wait_started(
    client: KubeClient, namespace: str, selector: str, node: int, rv: str
) -> Mapping[str, Any]:
    """Watch the node's pods until one of them has started; returns that pod."""
    seen: dict[str, Mapping[str, Any]] = {}
    what = f"wait for node {node} to start"
    while True:
        params = {
            "watch": "1",
            "labelSelector": selector,
            "resourceVersion": rv,
            "timeoutSeconds": str(_WAIT_SECONDS),
        }
        try:
            async for line in client.stream(
                PODS.path(namespace), what=what, params=params, read_timeout=_WAIT_SECONDS + 30.0
            ):
                try:
                    event = json.loads(line)
                except ValueError:
                    continue
                obj = as_map(as_map(event).get("object"))
                meta = as_map(obj.get("metadata"))
                etype = as_map(event).get("type")
                if etype == "ERROR":
                    code = obj.get("code")
                    raise map_status(code if isinstance(code, int) else 500, obj, what=what)
                if isinstance(meta.get("resourceVersion"), str):
                    rv = meta["resourceVersion"]
                name = meta.get("name")
                if not isinstance(name, str):
                    continue
                if etype == "DELETED":
                    seen.pop(name, None)
                elif etype in ("ADDED", "MODIFIED"):
                    seen[name] = obj
                pod = node_pod(list(seen.values()), node)
                if pod is not None and _started(pod):
                    return pod
        except ExpiredError:
            pass  # list again below
        except (UnavailableError, OutcomeUnknownError):
            pass  # the stream broke: list again below and watch on
        items, rv = await _pods(client, namespace, selector)
        seen = {str(as_map(p.get("metadata")).get("name")): p for p in items}
        pod = node_pod(items, node)
        if pod is not None and _started(pod):
            return pod


async def stream_output(
    client: KubeClient,
    namespace: str,
    identity: Identity,
    *,
    node: int,
    follow: bool,
    tail: int | None,
    previous: bool,
    num_nodes: int | None,
    since: float | None = None,
    timestamps: bool = False,
    pods: Pods | None = None,
) -> AsyncIterator[str]:
    """The lines of node ``node`` (see the module docstring). ``num_nodes`` (when known) bounds ``node``;
    ``pods``: the incarnation's pods as a listing just made gave them (else its node's are listed)."""
    if isinstance(node, bool) or not isinstance(node, int) or node < 0:
        raise InvalidError(f"expected a node index >= 0, got {node!r}", path="node")
    if num_nodes is not None and node >= num_nodes:
        raise InvalidError(
            f"node {node} does not exist: the job has {num_nodes} node(s), 0 to {num_nodes - 1}", path="node"
        )
    if tail is not None and (isinstance(tail, bool) or not isinstance(tail, int) or tail < 0):
        raise InvalidError(f"expected a line count >= 0, got {tail!r}", path="tail")
    selector = _selector(identity, node)
    listed, rv = pods if pods is not None else await _pods(client, namespace, selector)
    pod = node_pod(listed, node)
    if follow and not previous and (pod is None or not _started(pod)):
        pod = await _wait_started(client, namespace, selector, node, rv)
    if pod is None:
        raise NotFoundError(
            f"node {node} of {identity} has no pod: it has not been created yet, or it is gone"
        )
    name = str(as_map(pod.get("metadata")).get("name"))
    what = f'read the output of node {node} of {identity} (pod "{name}")'
    if not follow or previous:
        try:
            lines = await read_tail(
                client, namespace, name, lines=tail, previous=previous, since=since, timestamps=timestamps
            )
        except InvalidError as exc:  # 400: the container has not started (or has no earlier run)
            raise BusyError(f"{what}: {exc}; retry later") from None
        for line in lines:
            yield line
        return
    params = {"container": NODE_CONTAINER, "follow": "true", **_time_params(since, timestamps)}
    if tail is not None:
        params["tailLines"] = str(tail)
    async for line in client.stream(_log_path(namespace, name), what=what, params=params):
        yield line
