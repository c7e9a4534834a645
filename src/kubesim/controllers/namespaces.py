"""What kube-controller-manager puts in every namespace: the ``default`` ServiceAccount (the serviceaccount
controller) and the ``kube-root-ca.crt`` ConfigMap (the root-ca-cert-publisher), recreated when deleted.

Pods name the ``default`` ServiceAccount and project ``kube-root-ca.crt`` into their ``kube-api-access``
volume (``kubesim.defaults``), so both must exist wherever pods run, as on a cluster.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kubesim.controllers.base import BaseController, Key
from kubesim.errors import ApiError
from kubesim.resources import CONFIGMAPS, NAMESPACES, SERVICEACCOUNTS

if TYPE_CHECKING:
    from kubesim.store import WatchEvent

__all__ = ["ROOT_CA_CONFIGMAP", "NamespaceDefaultsController"]

ROOT_CA_CONFIGMAP = "kube-root-ca.crt"
DEFAULT_SERVICEACCOUNT = "default"
# the annotation the root-ca-cert-publisher writes (pkg/controller/certificates/rootcacertpublisher)
_DESCRIPTION = (
    "Contains a CA bundle that can be used to verify the kube-apiserver when using internal endpoints such "
    "as the internal service IP or kubernetes.default.svc. No other usage is guaranteed across distributions "
    "of Kubernetes clusters."
)


class NamespaceDefaultsController(BaseController):
    """Keeps the ``default`` ServiceAccount and the ``kube-root-ca.crt`` ConfigMap in every active namespace."""

    name = "namespace-defaults"

    def resync(self) -> None:
        for ns in self.store.list(NAMESPACES)[0]:
            self.enqueue("", ns["metadata"]["name"])

    def keys_for(self, ev: WatchEvent) -> Iterable[Key]:
        meta = ev.obj["metadata"]
        if ev.rt == NAMESPACES:
            yield ("", meta["name"])
        elif ev.type == "DELETED" and (ev.rt, meta["name"]) in (
            (SERVICEACCOUNTS, DEFAULT_SERVICEACCOUNT),
            (CONFIGMAPS, ROOT_CA_CONFIGMAP),
        ):
            yield ("", meta.get("namespace") or "")

    def reconcile(self, namespace: str, name: str) -> None:
        ns = self.get_or_none(NAMESPACES, None, name)
        if ns is None or ns["metadata"].get("deletionTimestamp"):
            return  # a terminating namespace refuses new objects
        cert = getattr(self.sim, "cert", None)
        ca = cert.cert_pem.decode() if cert is not None else ""
        self._ensure(
            SERVICEACCOUNTS,
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": DEFAULT_SERVICEACCOUNT, "namespace": name},
            },
        )
        self._ensure(
            CONFIGMAPS,
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": ROOT_CA_CONFIGMAP,
                    "namespace": name,
                    "annotations": {"kubernetes.io/description": _DESCRIPTION},
                },
                "data": {"ca.crt": ca},
            },
        )

    def _ensure(self, rt: Any, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        if self.get_or_none(rt, meta["namespace"], meta["name"]) is not None:
            return
        try:
            self.store.create(rt, obj)
        except ApiError as e:
            if e.code not in (403, 404, 409):  # terminating or gone namespace, or created meanwhile
                raise
