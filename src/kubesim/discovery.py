"""Discovery documents: ``/version``, ``/api``, ``/apis``, ``/apis/<g>[/<v>]``, OpenAPI v2 and v3.

Pure functions of the served resource types, shaped as kubectl and lightkube read them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kubesim.fields import openapi_schemas
from kubesim.resources import ResourceType

__all__ = ["KUBE_VERSION", "document"]

KUBE_VERSION = {
    "major": "1",
    "minor": "36",
    "emulationMajor": "1",
    "emulationMinor": "36",
    "minCompatibilityMajor": "1",
    "minCompatibilityMinor": "35",
    "gitVersion": "v1.36.2-kubesim",
    "gitCommit": "0000000000000000000000000000000000000000",
    "gitTreeState": "clean",
    "buildDate": "2026-11-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}


def document(parts: list[str], served: Sequence[ResourceType], address: str) -> dict[str, Any] | None:
    """The discovery document at the path ``/`` + ``"/".join(parts)``, or None (404) if there is none."""
    if not parts:
        paths = ["/api", "/api/v1", "/apis", "/healthz", "/livez", "/readyz", "/version"]
        paths += sorted({f"/apis/{rt.group}" for rt in served if rt.group})
        paths += sorted({f"/apis/{rt.api_version}" for rt in served if rt.group})
        return {"paths": paths}
    if parts == ["version"]:
        return dict(KUBE_VERSION)
    if parts == ["openapi", "v2"]:
        return openapi_v2(served)
    if parts == ["openapi", "v3"]:
        return openapi_root(served)
    if len(parts) >= 3 and parts[:2] == ["openapi", "v3"]:
        return openapi_group_version(served, "/".join(parts[2:]))
    if parts == ["api"]:
        return {
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": address}],
        }
    if parts == ["api", "v1"]:
        return resource_list(served, "", "v1")
    if parts == ["apis"]:
        return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups(served)}
    if len(parts) == 2 and parts[0] == "apis":
        for g in groups(served):
            if g["name"] == parts[1]:
                return {"kind": "APIGroup", "apiVersion": "v1", **g}
        return None
    if len(parts) == 3 and parts[0] == "apis":
        body = resource_list(served, parts[1], parts[2])
        return body if body["resources"] else None
    return None


def groups(served: Sequence[ResourceType]) -> list[dict[str, Any]]:
    """The APIGroup entries of the served named groups (the core group is under ``/api``)."""
    versions_of: dict[str, list[str]] = {}
    for rt in served:
        if rt.group and rt.version not in versions_of.setdefault(rt.group, []):
            versions_of[rt.group].append(rt.version)
    out = []
    for g in sorted(versions_of):
        versions = [{"groupVersion": f"{g}/{v}", "version": v} for v in versions_of[g]]
        out.append({"name": g, "versions": versions, "preferredVersion": versions[0]})
    return out


def resource_list(served: Sequence[ResourceType], group: str, version: str) -> dict[str, Any]:
    """The APIResourceList of one group/version, subresources included (``pods/log``, ``x/status``)."""
    resources: list[dict[str, Any]] = []
    for rt in sorted(served, key=lambda r: r.plural):
        if rt.group != group or rt.version != version:
            continue
        entry: dict[str, Any] = {
            "name": rt.plural,
            "singularName": rt.singular,
            "namespaced": rt.namespaced,
            "kind": rt.kind,
            "verbs": sorted(rt.verbs),
        }
        if rt.short_names:
            entry["shortNames"] = list(rt.short_names)
        if rt.categories:
            entry["categories"] = list(rt.categories)
        resources.append(entry)
        for sub in sorted(rt.subresources):
            resources.append(
                {
                    "name": f"{rt.plural}/{sub}",
                    "singularName": "",
                    "namespaced": rt.namespaced,
                    "kind": rt.kind,
                    "verbs": ["get"] if sub == "log" else ["get", "patch", "update"],
                }
            )
    gv = f"{group}/{version}" if group else version
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}


def _gv_path(rt: ResourceType) -> str:
    return f"apis/{rt.group}/{rt.version}" if rt.group else "api/v1"


def openapi_root(served: Sequence[ResourceType]) -> dict[str, Any]:
    """The OpenAPI v3 index. The per group-version documents list each resource's operations and their
    query parameters (so kubectl sees that the server validates fields itself) and the kinds' schemas
    (for ``kubectl explain``); the patch operations declare no request body, so kubectl's client-side
    apply keeps using merge patches for custom resources."""
    paths = {}
    for gvp in sorted({_gv_path(rt) for rt in served}):
        paths[gvp] = {"serverRelativeURL": f"/openapi/v3/{gvp}?hash=kubesim-{KUBE_VERSION['gitVersion']}"}
    return {"paths": paths}


def _operation(
    action: str, gvk: dict[str, str], params: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    op: dict[str, Any] = {"x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk}
    if params is not None:
        op["parameters"] = params
    op["responses"] = {"200": {"description": "OK"}}
    return op


def openapi_group_version(served: Sequence[ResourceType], gv_path: str) -> dict[str, Any] | None:
    """The OpenAPI v3 document of one group/version (``api/v1``, ``apis/batch/v1``), or None."""
    rts = [rt for rt in served if _gv_path(rt) == gv_path]
    if not rts:
        return None
    params = [
        {"name": n, "in": "query", "schema": {"type": "string"}, "uniqueItems": True}
        for n in ("dryRun", "fieldManager", "fieldValidation", "pretty")
    ]
    force = {"name": "force", "in": "query", "schema": {"type": "boolean"}}
    paths: dict[str, Any] = {}
    for rt in rts:
        gvk = {"group": rt.group, "version": rt.version, "kind": rt.kind}
        base = "/" + gv_path + ("/namespaces/{namespace}" if rt.namespaced else "") + f"/{rt.plural}"
        if rt.verbs == ("create",):  # e.g. SelfSubjectAccessReview
            paths[base] = {"post": _operation("post", gvk, params)}
            continue
        paths[base] = {"get": _operation("list", gvk), "post": _operation("post", gvk, params)}
        paths[base + "/{name}"] = {
            "get": _operation("get", gvk),
            "put": _operation("put", gvk, params),
            "patch": _operation("patch", gvk, [*params, force]),
            "delete": _operation("delete", gvk),
        }
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (kubesim)", "version": KUBE_VERSION["gitVersion"]},
        "paths": paths,
        "components": {"schemas": openapi_schemas(rts)},
    }


def _v2_schema(node: Any) -> Any:
    """A v3 component schema as Swagger 2.0 writes it: ``#/definitions/`` references, and int-or-string
    as ``type: string, format: int-or-string`` (v2 has no ``anyOf``), as kube-openapi's v2 builder does."""
    if isinstance(node, list):
        return [_v2_schema(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _v2_schema(v) for k, v in node.items() if k != "anyOf"}
    if "$ref" in out:
        out["$ref"] = out["$ref"].replace("#/components/schemas/", "#/definitions/")
    if node.get("x-kubernetes-int-or-string"):
        out.update(type="string", format="int-or-string")
    return out


def openapi_v2(served: Sequence[ResourceType]) -> dict[str, Any]:
    """The whole-server Swagger 2.0 document (``/openapi/v2``): every group-version's paths and schemas in
    one, the form clients older than OpenAPI v3 support read (kubectl only falls back to it for a kind the
    v3 documents lack)."""
    paths: dict[str, Any] = {}
    definitions: dict[str, Any] = {}
    for gvp in sorted({_gv_path(rt) for rt in served}):
        doc = openapi_group_version(served, gvp)
        if doc is None:
            continue
        for path, ops in doc["paths"].items():
            paths[path] = {verb: {**op, "parameters": op.get("parameters", [])} for verb, op in ops.items()}
        definitions.update(_v2_schema(doc["components"]["schemas"]))
    return {
        "swagger": "2.0",
        "info": {"title": "Kubernetes (kubesim)", "version": KUBE_VERSION["gitVersion"]},
        "paths": paths,
        "definitions": definitions,
    }
