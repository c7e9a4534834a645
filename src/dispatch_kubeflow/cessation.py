"""Cessation (SPEC §9.6): an incarnation has ceased only when its TrainJob, its JobSet and every pod of it
are gone from the cluster; and :func:`stop`, which makes that happen on every Trainer in the field.

How a stop converges: a real Trainer v2.3.0 re-applies the JobSet after the garbage collector removes it
while the TrainJob is being deleted with *foreground* propagation, so pods keep coming back and the
deletion never ends. So the pods are made to go first (the TrainJob suspended; under Kueue, which owns
``suspend``, its Workload deactivated), and the TrainJob is deleted in the *background*: it goes at once,
and the collector removes the JobSet, Jobs and pods after it. One stop sends at most one DELETE; a
deletion already under way is not sent again, except to turn a foreground one (an older dispatch's,
``kubectl --cascade=foreground``) into a background one.

:func:`read_remains` reads them (three requests); :func:`require_ceased` raises
:class:`~dispatch_kubeflow.PodsRemainError` naming what remains; :func:`wait_ceased` waits on watches of the
object that still blocks (the TrainJob while it is there, then its JobSet, then its pods), re-reading after
each change and at least every ``WAIT_SECONDS`` — bounded by the caller with ``asyncio.timeout``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from typing import Any

from dispatch.clock import Clock
from dispatch.errors import DispatchError, NotFoundError
from dispatch.model import Handle
from dispatch_kubeflow.errors import PodsRemainError
from dispatch_kubeflow.incarnation import DeletionClock, Remains, remains, stuck_message
from dispatch_kubeflow.kube import KubeClient
from dispatch_kubeflow.naming import identity_labels
from dispatch_kubeflow.resources import JOBSETS, LABEL_JOB_UID, PODS, TRAINJOBS, WORKLOADS

__all__ = ["WAIT_SECONDS", "read_remains", "require_ceased", "stop", "wait_ceased"]

_log = logging.getLogger("dispatch.kubeflow")

FOREGROUND = "foregroundDeletion"

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
    own = identity_labels(handle.identity)
    if js is not None and any(
        _map(_map(js.get("metadata")).get("labels")).get(k) != v for k, v in own.items()
    ):
        js = None  # not this incarnation's (it carries no identity, or another's): it does not count
    selector = ",".join(f"{k}={v}" for k, v in own.items())
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


def _finished(trainjob: Mapping[str, Any]) -> bool:
    conditions = _map(trainjob.get("status")).get("conditions")
    for c in conditions if isinstance(conditions, list) else []:
        if _map(c).get("type") in ("Complete", "Failed") and _map(c).get("status") == "True":
            return True
    return False


async def stop(
    client: KubeClient, trainjob: Mapping[str, Any], *, ref: str, kueue: bool, queueing: bool
) -> None:
    """Stop the incarnation whose TrainJob is ``trainjob`` (as just read): see the module docstring.
    ``kueue``: Kueue is installed (the TrainJob may have a Workload); ``queueing``: Kueue owns
    ``spec.suspend`` for this adapter's jobs. Returns before the pods are gone."""
    meta = _map(trainjob.get("metadata"))
    namespace, name, uid = str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", ""))
    path = f"{TRAINJOBS.path(namespace)}/{name}"
    what = f'delete TrainJob "{ref}"'
    if meta.get("deletionTimestamp"):
        finalizers = meta.get("finalizers")
        if isinstance(finalizers, list) and FOREGROUND in finalizers:
            # The API server drops the foreground finalizer when a later DELETE asks for background.
            await _delete(client, path, what=f"{what} in the background", uid=uid)
        return
    if not _finished(trainjob):
        await _pods_first(client, trainjob, ref=ref, kueue=kueue, queueing=queueing)
    await _delete(client, path, what=what, uid=uid)


async def _delete(client: KubeClient, path: str, *, what: str, uid: str) -> None:
    try:
        await client.delete(path, what=what, propagation="Background", uid=uid or None)
    except NotFoundError:
        return


async def _pods_first(
    client: KubeClient, trainjob: Mapping[str, Any], *, ref: str, kueue: bool, queueing: bool
) -> None:
    """Make the incarnation's pods go before its TrainJob does: deactivate its Workload (Kueue evicts it
    and suspends the TrainJob) or suspend the TrainJob. Best effort: the delete follows either way."""
    meta = _map(trainjob.get("metadata"))
    namespace, name, uid = str(meta.get("namespace", "")), str(meta.get("name", "")), str(meta.get("uid", ""))
    try:
        if kueue and uid:
            found = await client.list(
                WORKLOADS.path(namespace),
                what=f'list the Workload of TrainJob "{ref}"',
                label_selector=f"{LABEL_JOB_UID}={uid}",
            )
            for wl in found:
                wl_name = str(_map(wl.get("metadata")).get("name", ""))
                if wl_name and _map(wl.get("spec")).get("active") is not False:
                    await client.patch(
                        f"{WORKLOADS.path(namespace)}/{wl_name}",
                        {"spec": {"active": False}},
                        what=f'deactivate Workload "{namespace}/{wl_name}" of TrainJob "{ref}"',
                    )
            if queueing or found:
                return
        if _map(trainjob.get("spec")).get("suspend") is not True:
            await client.patch(
                f"{TRAINJOBS.path(namespace)}/{name}",
                {
                    "metadata": {"resourceVersion": str(meta.get("resourceVersion", ""))},
                    "spec": {"suspend": True},
                },
                what=f'suspend TrainJob "{ref}" before deleting it',
            )
    except DispatchError as exc:
        # Changed meanwhile, refused by a webhook or RBAC, already gone: deleting still ends it.
        _log.info("stop %s: could not make its pods go first (%s); deleting it", ref, exc)
