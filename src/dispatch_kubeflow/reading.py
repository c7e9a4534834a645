"""Reads beside the shared cache (:mod:`dispatch_kubeflow.informer`): a TrainJob that answers 404 is
confirmed gone by a second, differently routed read before it is reported lost (:func:`confirm_gone`);
the Events of an incarnation whose failure nothing cached explains (:func:`events_of`).
"""

from __future__ import annotations

import logging
from typing import Any

from dispatch.errors import DispatchError, NotFoundError, UnavailableError
from dispatch_kubeflow.kube import KubeClient
from dispatch_kubeflow.resources import EVENTS, TRAINJOBS

__all__ = ["confirm_gone", "events_of"]

_log = logging.getLogger(__name__)


async def confirm_gone(client: KubeClient, namespace: str, name: str) -> dict[str, Any] | None:
    """After a 404 on ``name``: a second, differently routed read — a list of TrainJobs selecting that name —
    that must answer as a served collection. Returns the TrainJob if it is there after all, ``None`` if it is
    confirmed gone; a collection that is not served (the CRD is being reinstalled, a proxy misroutes) is
    an ``UnavailableError``, not a lost job."""
    what = f'confirm that TrainJob "{name}" is gone'
    try:
        found = await client.request(
            "GET", TRAINJOBS.path(namespace), what=what, params={"fieldSelector": f"metadata.name={name}"}
        )
    except NotFoundError:
        raise UnavailableError(
            f"{what}: the API server does not serve TrainJobs right now (404 on the collection); not calling "
            "the job lost — try again"
        ) from None
    items = found.get("items") if isinstance(found, dict) else None
    if not isinstance(items, list) or str(found.get("kind", "")) not in ("TrainJobList", ""):
        raise UnavailableError(
            f"{what}: the answer is not a list of TrainJobs; not calling the job lost — try again"
        )
    from dispatch_kubeflow.causes import TrainJob  # not at the top: see Backend._fold

    for item in items:
        if isinstance(item, dict) and TrainJob.parse(item).name == name:
            return item
    return None


async def events_of(client: KubeClient, namespace: str, name: str) -> list[dict[str, Any]]:
    """The Kubernetes Events about incarnation ``name``'s objects — its TrainJob, JobSet, Jobs and pods, all
    named after it — which the API server keeps about an hour, after the pods are gone (SPEC §7). One list
    of the namespace's Events (a field selector cannot select by name prefix, and the pods' names are not
    known to a process that never saw them), read only for a failure whose pods are gone and that nothing
    else explains; none when they are not readable (the failure then stays unexplained)."""
    try:
        events = await client.list(EVENTS.path(namespace), what=f'list the Events of TrainJob "{name}"')
    except DispatchError as exc:
        _log.info("could not read the Events of TrainJob %s: %s", name, exc)
        return []
    mine = []
    for event in events:
        about = event.get("involvedObject")
        who = about.get("name") if isinstance(about, dict) else None
        if isinstance(who, str) and (who == name or who.startswith(f"{name}-")):
            mine.append(event)
    return mine
