"""Reads beside the shared cache (:mod:`dispatch_kubeflow.informer`): a TrainJob that answers 404 is
confirmed gone by a second, differently routed read before it is reported lost (:func:`confirm_gone`).
"""

from __future__ import annotations

from typing import Any

from dispatch.errors import NotFoundError, UnavailableError
from dispatch_kubeflow.causes import TrainJob
from dispatch_kubeflow.kube import KubeClient
from dispatch_kubeflow.resources import TRAINJOBS

__all__ = ["confirm_gone"]


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
    for item in items:
        if isinstance(item, dict) and TrainJob.parse(item).name == name:
            return item
    return None
