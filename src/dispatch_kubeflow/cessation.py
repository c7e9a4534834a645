"""Cessation (SPEC §9.6): an incarnation has ceased only when its TrainJob, its JobSet and every pod of it
are gone from the cluster.

:func:`read_remains` reads them (three requests); :func:`require_ceased` raises
:class:`~dispatch_kubeflow.PodsRemainError` naming what remains; :func:`wait_ceased` waits on watches of the
object that still blocks (the TrainJob while it is there, then its JobSet, then its pods), re-reading after
each change and at least every ``WAIT_SECONDS`` — bounded by the caller with ``asyncio.timeout``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from dispatch.clock import Clock
from dispatch.errors import DispatchError
from dispatch.model import Handle
from dispatch_kubeflow.errors import PodsRemainError
from dispatch_kubeflow.incarnation import DeletionClock, Remains, remains, stuck_message
from dispatch_kubeflow.kube import KubeClient
from dispatch_kubeflow.naming import identity_labels
from dispatch_kubeflow.resources import JOBSETS, PODS, TRAINJOBS

__all__ = ["WAIT_SECONDS", "read_remains", "require_ceased", "wait_ceased"]

WAIT_SECONDS = 30


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _paths(namespace: str, name: str) -> tuple[str, str, str]:
    return (
        TRAINJOBS.path(namespace),
        JOBSETS.path(namespace),
        PODS.path(namespace),
    )


async def _get(client: KubeClient, path: str, what: str) -> dict[str, Any] | None:
    return await client.get_or_none(path, what=what)


async def read_remains(client: KubeClient, handle: Handle, name: str) -> tuple[Remains, dict[str, str]]:
    """What remains of the incarnation, and the resourceVersions to watch each kind from."""
    namespace = handle.ref.partition("/")[0]
    tjs, jss, pods_path = _paths(namespace, name)
    tj = await _get(client, f"{tjs}/{name}", f'get TrainJob "{handle.ref}"')
    js = await _get(client, f"{jss}/{name}", f'get JobSet "{handle.ref}"')
    selector = ",".join(f"{k}={v}" for k, v in identity_labels(handle.identity).items())
    what = f'list the pods of "{handle.ref}"'
    out = await client.request("GET", pods_path, what=what, params={"labelSelector": selector})
    out = out if isinstance(out, dict) else {}
    items = out.get("items")
    pods = [p for p in items if isinstance(p, dict)] if isinstance(items, list) else []
    rvs = {
        "trainjob": str(_map(_map(tj).get("metadata")).get("resourceVersion", "")) if tj else "",
        "jobset": str(_map(_map(js).get("metadata")).get("resourceVersion", "")) if js else "",
        "pods": str(_map(out.get("metadata")).get("resourceVersion", "")),
    }
    return remains(tj, js, pods), rvs


def _error(handle: Handle, left: Remains, stuck: float | None) -> PodsRemainError:
    if stuck is not None:
        return PodsRemainError(f"{handle}: {stuck_message(left, stuck)}")
    return PodsRemainError(
        f"{handle}: its compute is not gone yet: {left.describe()}; retry once it has ceased"
    )


async def require_ceased(
    client: KubeClient, handle: Handle, name: str, *, clock: Clock, deletions: DeletionClock
) -> None:
    """Return if the incarnation has ceased; else raise :class:`PodsRemainError` naming what remains, and
    saying so when its deletion does not complete."""
    left, _ = await read_remains(client, handle, name)
    stuck = deletions.stuck_for(left, clock.now())
    if not left.ceased:
        raise _error(handle, left, stuck)


async def _until_change(client: KubeClient, path: str, params: dict[str, str], what: str) -> bool:
    """Hold one watch until its first object event or its end (True), or an error (False); either way the
    caller reads again."""
    try:
        async for line in client.stream(path, what=what, params=params, read_timeout=WAIT_SECONDS + 30.0):
            try:
                event = json.loads(line)
            except ValueError:
                return False
            if _map(event).get("type") == "ERROR":
                return False
            if _map(event).get("type") != "BOOKMARK":
                return True
    except DispatchError:
        return False
    return True


async def wait_ceased(client: KubeClient, handle: Handle, name: str, *, clock: Clock) -> None:
    """Return once the incarnation has ceased (see the module docstring)."""
    namespace = handle.ref.partition("/")[0]
    tjs, jss, pods_path = _paths(namespace, name)
    failures = 0
    while True:
        try:
            left, rvs = await read_remains(client, handle, name)
        except DispatchError:
            failures += 1
            await clock.sleep(client.retry.delay(min(failures, 6)))
            continue
        if left.ceased:
            return
        base = {"watch": "1", "allowWatchBookmarks": "true", "timeoutSeconds": str(WAIT_SECONDS)}
        if left.trainjob is not None:
            params = {**base, "fieldSelector": f"metadata.name={name}", "resourceVersion": rvs["trainjob"]}
            ok = await _until_change(client, tjs, params, f'wait for TrainJob "{handle.ref}" to go')
        elif left.jobset is not None:
            params = {**base, "fieldSelector": f"metadata.name={name}", "resourceVersion": rvs["jobset"]}
            ok = await _until_change(client, jss, params, f'wait for JobSet "{handle.ref}" to go')
        else:
            selector = ",".join(f"{k}={v}" for k, v in identity_labels(handle.identity).items())
            params = {**base, "labelSelector": selector, "resourceVersion": rvs["pods"]}
            ok = await _until_change(client, pods_path, params, f'wait for the pods of "{handle.ref}" to go')
        failures = 0 if ok else failures + 1
        if not ok:  # the watch failed (expired, refused, cut): read again after a pause
            await clock.sleep(client.retry.delay(min(failures, 6)))
