"""The CustomResourceDefinitions kubesim serves (read-only in spirit): the TrainJob's, with its schema.

A client that checks a cluster's Trainer version by reading the TrainJob CRD (as dispatch's preflight
does) gets the schema kubesim prunes TrainJobs with (:mod:`kubesim.fields`, generated from the upstream
v2.3 CRD), as a real API server serves it. A test simulates an older Trainer by replacing the stored CRD with
``trainjob_crd(without=("runtimePatches", ...))``; the stored CRD describes, it does not change what kubesim
prunes.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from kubesim.fields import openapi_schemas, schema_name
from kubesim.resources import CUSTOMRESOURCEDEFINITIONS, TRAINJOBS

if TYPE_CHECKING:
    from kubesim.store import ObjectStore

__all__ = ["install_crds", "trainjob_crd"]


def _inline(node: Any, components: dict[str, Any]) -> Any:
    """An OpenAPI schema with every ``$ref`` replaced by what it names (CRD schemas carry no refs)."""
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str):
            return _inline(components[ref.rsplit("/", 1)[1]], components)
        return {k: _inline(v, components) for k, v in node.items() if k != "x-kubernetes-group-version-kind"}
    if isinstance(node, list):
        return [_inline(v, components) for v in node]
    return node


def trainjob_crd(*, without: Iterable[str] = ()) -> dict[str, Any]:
    """The TrainJob CRD; ``without`` names ``spec`` fields (dotted below ``spec``, e.g.
    ``"trainer.numProcPerNode"``) to leave out, as an older Trainer's CRD does."""
    rt = TRAINJOBS
    components = openapi_schemas([rt])
    schema = _inline(copy.deepcopy(components[schema_name(rt)]), components)
    spec = schema["properties"]["spec"]["properties"]
    for dotted in without:
        node: dict[str, Any] = {"properties": spec}
        parts = dotted.split(".")
        for part in parts[:-1]:
            node = node["properties"][part]
        node["properties"].pop(parts[-1], None)
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{rt.plural}.{rt.group}"},
        "spec": {
            "group": rt.group,
            "names": {
                "kind": rt.kind,
                "listKind": rt.list_kind,
                "plural": rt.plural,
                "singular": rt.singular,
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": rt.version,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {"status": {}},
                }
            ],
        },
    }


def install_crds(store: ObjectStore) -> None:
    """Create the CRDs kubesim describes (today: the TrainJob's)."""
    store.create(CUSTOMRESOURCEDEFINITIONS, trainjob_crd())
