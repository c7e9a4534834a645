"""The known fields of every served kind: pruning of unknown fields and ``fieldValidation``.

A real API server drops fields its types do not know: a built-in kind is decoded into a Go struct (unknown
JSON fields are lost), a custom resource is *pruned* against its CRD's structural schema
(``apiextensions-apiserver/pkg/apiserver/schema/pruning``). What the client hears depends on the request's
``fieldValidation``: ``Warn`` (the default) answers with one ``Warning: 299 - "unknown field \\"spec.x\\""``
header per field, ``Strict`` refuses the request with 400 ``strict decoding error: unknown field
"spec.x"``, ``Ignore`` drops them silently.

The skeletons of the custom resources (and of the batch/v1 JobSpec and core/v1 PodSpec embedded in them)
are generated from the upstream CRDs into ``schemas.json`` by ``tools/kubesim_schemas.py``: field names,
JSON types and the structural markers only. The few core kinds without such a source are written here.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import cache
from importlib import resources
from typing import Any

from kubesim.resources import (
    CONFIGMAPS,
    EVENTS,
    EVENTS_V1,
    JOBS,
    LEASES,
    NAMESPACES,
    NODES,
    PODS,
    SECRETS,
    SERVICES,
    ResourceType,
)

__all__ = ["OBJECT_META", "Node", "openapi_schemas", "prune_unknown", "schema_name", "schema_of"]

Node = dict[str, Any]


def _n(t: str, **props: Node) -> Node:
    node: Node = {"t": t}
    if props:
        node["p"] = props
    return node


_S, _I, _B = _n("string"), _n("integer"), _n("boolean")
_STRINGS: Node = {"t": "array", "i": _S}
_STRING_MAP: Node = {"t": "object", "a": _S}
_PRESERVE: Node = {"t": "object", "x": 1}

#: metav1.ObjectMeta, as the apiserver keeps it for every kind (custom resources included).
OBJECT_META: Node = _n(
    "object",
    name=_S,
    generateName=_S,
    namespace=_S,
    selfLink=_S,
    uid=_S,
    resourceVersion=_S,
    generation=_I,
    creationTimestamp=_S,
    deletionTimestamp=_S,
    deletionGracePeriodSeconds=_I,
    labels=_STRING_MAP,
    annotations=_STRING_MAP,
    ownerReferences={
        "t": "array",
        "i": _n("object", apiVersion=_S, kind=_S, name=_S, uid=_S, controller=_B, blockOwnerDeletion=_B),
    },
    finalizers=_STRINGS,
    managedFields={"t": "array", "i": _PRESERVE},
)


@cache
def _data() -> dict[str, Any]:
    text = resources.files("kubesim").joinpath("schemas.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def _resolve(node: Any) -> Any:
    """``node`` with every shared ``{"$": id}`` reference replaced by its definition (recursively)."""
    defs = _data()["defs"]
    if isinstance(node, dict):
        if "$" in node:
            return _resolve(defs[node["$"]])
        return {k: _resolve(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v) for v in node]
    return node


def _generated(key: str) -> Node:
    out: Node = _resolve(_data()["kinds"][key])
    return out


def _root(**props: Node) -> Node:
    return _n("object", apiVersion=_S, kind=_S, metadata=OBJECT_META, **props)


def _raw(key: str) -> Node:
    out: Node = _data()["kinds"][key]
    return out


def _core(rt: ResourceType, gen: Callable[[str], Node] = _generated) -> Node | None:
    """The core kinds kubesim serves; statuses the simulator writes are kept as they are (see docs).
    ``gen`` reads a generated skeleton (resolved, or with its shared references for OpenAPI)."""
    if rt is PODS:
        return _root(spec=gen("/PodSpec"), status=_PRESERVE)
    if rt is JOBS:
        return _root(spec=gen("batch/JobSpec"), status=_PRESERVE)
    if rt is CONFIGMAPS:
        return _root(data=_STRING_MAP, binaryData=_STRING_MAP, immutable=_B)
    if rt is SECRETS:
        return _root(data=_STRING_MAP, stringData=_STRING_MAP, type=_S, immutable=_B)
    if rt is NAMESPACES:
        return _root(spec=_n("object", finalizers=_STRINGS), status=_PRESERVE)
    if rt is NODES:
        taint = _n("object", key=_S, value=_S, effect=_S, timeAdded=_S)
        spec = _n(
            "object",
            podCIDR=_S,
            podCIDRs=_STRINGS,
            providerID=_S,
            unschedulable=_B,
            taints={"t": "array", "i": taint},
            configSource=_PRESERVE,
            externalID=_S,
        )
        return _root(spec=spec, status=_PRESERVE)
    if rt is SERVICES:
        port = _n(
            "object",
            name=_S,
            protocol=_S,
            appProtocol=_S,
            port=_I,
            targetPort=_n("int-or-string"),
            nodePort=_I,
        )
        spec = _n(
            "object",
            ports={"t": "array", "i": port},
            selector=_STRING_MAP,
            clusterIP=_S,
            clusterIPs=_STRINGS,
            type=_S,
            externalIPs=_STRINGS,
            sessionAffinity=_S,
            loadBalancerIP=_S,
            loadBalancerSourceRanges=_STRINGS,
            externalName=_S,
            externalTrafficPolicy=_S,
            healthCheckNodePort=_I,
            publishNotReadyAddresses=_B,
            sessionAffinityConfig=_PRESERVE,
            ipFamilies=_STRINGS,
            ipFamilyPolicy=_S,
            allocateLoadBalancerNodePorts=_B,
            loadBalancerClass=_S,
            internalTrafficPolicy=_S,
            trafficDistribution=_S,
        )
        return _root(spec=spec, status=_PRESERVE)
    if rt in (EVENTS, EVENTS_V1):
        # one storage, two versions: the same object reference, fields named per version
        ref = _n(
            "object", kind=_S, namespace=_S, name=_S, uid=_S, apiVersion=_S, resourceVersion=_S, fieldPath=_S
        )
    if rt is EVENTS:
        return _root(
            involvedObject=ref,
            reason=_S,
            message=_S,
            source=_n("object", component=_S, host=_S),
            firstTimestamp=_S,
            lastTimestamp=_S,
            count=_I,
            type=_S,
            eventTime=_S,
            series=_PRESERVE,
            action=_S,
            related=ref,
            reportingComponent=_S,
            reportingInstance=_S,
        )
    if rt is EVENTS_V1:
        return _root(
            eventTime=_S,
            series=_n("object", count=_I, lastObservedTime=_S),
            reportingController=_S,
            reportingInstance=_S,
            action=_S,
            reason=_S,
            regarding=ref,
            related=ref,
            note=_S,
            type=_S,
            deprecatedSource=_n("object", component=_S, host=_S),
            deprecatedFirstTimestamp=_S,
            deprecatedLastTimestamp=_S,
            deprecatedCount=_I,
        )
    if rt is LEASES:
        spec = _n(
            "object",
            holderIdentity=_S,
            leaseDurationSeconds=_I,
            acquireTime=_S,
            renewTime=_S,
            leaseTransitions=_I,
            strategy=_S,
            preferredHolder=_S,
        )
        return _root(spec=spec)
    return None


@cache
def schema_of(rt: ResourceType) -> Node | None:
    """The field skeleton of ``rt`` (None: a kind whose bodies are not pruned, such as reviews)."""
    core = _core(rt)
    if core is not None:
        return core
    key = f"{rt.group}/{rt.plural}"
    if key not in _data()["kinds"]:
        return None
    root = _generated(key)
    root["p"]["metadata"] = OBJECT_META
    return root


def prune_unknown(rt: ResourceType, obj: dict[str, Any]) -> list[str]:
    """Remove the fields of ``obj`` (in place) that ``rt`` does not know; return their paths, sorted, as
    the apiserver names them (``spec.template.spec.containers[0].x``). Values of the wrong JSON type are
    left alone for validation to refuse."""
    schema = schema_of(rt)
    if schema is None:
        return []
    pruned: list[str] = []
    _prune(obj, schema, "", pruned)
    return sorted(pruned)


def _prune(value: Any, node: Node, path: str, pruned: list[str]) -> None:
    preserve = bool(node.get("x"))
    if isinstance(value, dict):
        if node.get("t") not in (None, "object"):
            return
        props: dict[str, Node] = node.get("p") or {}
        extra = node.get("a")
        for key in list(value):
            if node.get("e") and key in ("apiVersion", "kind", "metadata"):
                continue  # an embedded object's type and metadata are its own
            sub = f"{path}.{key}" if path else key
            if key in props:
                _prune(value[key], props[key], sub, pruned)
            elif isinstance(extra, dict):
                _prune(value[key], extra, sub, pruned)
            elif extra is True or preserve:
                continue
            else:
                pruned.append(sub)
                del value[key]
    elif isinstance(value, list) and isinstance(node.get("i"), dict):
        for i, item in enumerate(value):
            _prune(item, node["i"], f"{path}[{i}]", pruned)


# ------------------------------------------------------------------------------------------- OpenAPI

_SHARED = "io.kubesim.shared."


def schema_name(rt: ResourceType) -> str:
    """The component name the apiserver gives a kind's schema: ``io.k8s.api.core.v1.Pod``,
    ``io.k8s.api.batch.v1.Job``, and for a custom resource its reversed group, version and kind
    (``org.kubeflow.trainer.v1alpha1.TrainJob``)."""
    if rt.group in ("", "batch", "coordination.k8s.io"):
        group = {"": "core", "batch": "batch", "coordination.k8s.io": "coordination"}[rt.group]
        return f"io.k8s.api.{group}.{rt.version}.{rt.kind}"
    return ".".join(reversed(rt.group.split("."))) + f".{rt.version}.{rt.kind}"


def _openapi(node: Any, refs: set[str]) -> Any:
    """A skeleton node as an OpenAPI v3 schema (shared sub-trees become ``$ref``s, collected in ``refs``)."""
    if not isinstance(node, dict):
        return node
    if "$" in node:
        refs.add(node["$"])
        return {"$ref": f"#/components/schemas/{_SHARED}{node['$']}"}
    out: dict[str, Any] = {}
    t = node.get("t")
    if t == "int-or-string":
        out["x-kubernetes-int-or-string"] = True
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    elif t:
        out["type"] = t
    if "p" in node:
        out["properties"] = {k: _openapi(v, refs) for k, v in node["p"].items()}
    if isinstance(node.get("a"), dict):
        out["additionalProperties"] = _openapi(node["a"], refs)
    elif node.get("a") is True:
        out["additionalProperties"] = True
    if "i" in node:
        out["items"] = _openapi(node["i"], refs)
    if node.get("x"):
        out["x-kubernetes-preserve-unknown-fields"] = True
    if node.get("e"):
        out["x-kubernetes-embedded-resource"] = True
    if node.get("r"):
        out["required"] = list(node["r"])
    return out


def openapi_schemas(rts: Sequence[ResourceType]) -> dict[str, Any]:
    """``components.schemas`` of an OpenAPI v3 group-version document: each kind's schema (with its
    ``x-kubernetes-group-version-kind``) and the shared sub-trees they reference. Field names and types
    only: ``kubectl explain`` lists the fields, without descriptions."""
    out: dict[str, Any] = {}
    refs: set[str] = set()
    for rt in rts:
        node = _core(rt, _raw)
        if node is None:
            key = f"{rt.group}/{rt.plural}"
            if key not in _data()["kinds"]:
                continue
            node = dict(_raw(key))
            if "$" in node:
                node = dict(_data()["defs"][node["$"]])
            node["p"] = {**node["p"], "metadata": OBJECT_META}
        schema = _openapi(node, refs)
        schema["x-kubernetes-group-version-kind"] = [
            {"group": rt.group, "version": rt.version, "kind": rt.kind}
        ]
        out[schema_name(rt)] = schema
    done: set[str] = set()
    while refs - done:
        ref = sorted(refs - done)[0]
        done.add(ref)
        out[_SHARED + ref] = _openapi(_data()["defs"][ref], refs)
    return out
