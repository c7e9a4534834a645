"""Does this cluster's TrainJob schema have every field dispatch sends? (pure; SPEC §9.3)

Every Trainer v2 release serves ``trainer.kubeflow.org/v1alpha1``, but the fields differ: a v2.1 CRD has no
``spec.runtimePatches`` nor ``spec.activeDeadlineSeconds``. Writes go out with ``fieldValidation=Strict``,
so such a cluster would refuse every start; preflight reads the schema first and refuses the cluster,
naming each missing field and the Trainer version that has it.

The schema comes from the TrainJob CRD (``apiextensions.k8s.io/v1``) or, when the credentials may not read
CRDs, from the API server's OpenAPI v3 document of the group.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from dispatch_kubeflow.names import TRAINER_GROUP, TRAINER_VERSION
from dispatch_kubeflow.objects import as_map

__all__ = ["CRD_NAME", "SENT_FIELDS", "missing_fields", "schema_from_crd", "schema_from_openapi"]

CRD_NAME: Final = f"trainjobs.{TRAINER_GROUP}"

SENT_FIELDS: Final[tuple[tuple[str, str, str | None], ...]] = (
    # (field below the TrainJob, the Trainer release that has it in this shape, JSON type required)
    ("spec.runtimeRef.name", "v2.0", "string"),
    ("spec.runtimeRef.kind", "v2.0", "string"),
    ("spec.runtimeRef.apiGroup", "v2.0", "string"),
    ("spec.trainer.image", "v2.0", "string"),
    ("spec.trainer.command", "v2.0", "array"),
    ("spec.trainer.env", "v2.0", "array"),
    ("spec.trainer.numNodes", "v2.0", "integer"),
    ("spec.trainer.numProcPerNode", "v2.2", "integer"),  # IntOrString before v2.2
    ("spec.trainer.resourcesPerNode", "v2.0", None),
    ("spec.suspend", "v2.0", "boolean"),
    ("spec.activeDeadlineSeconds", "v2.2", "integer"),
    ("spec.runtimePatches", "v2.2", "array"),
)
"""Every field dispatch writes on a TrainJob (``spec.trainer.resourcesPerNode`` only with settings that set
it, but it exists in every release)."""


def schema_from_crd(crd: Any) -> Mapping[str, Any] | None:
    """The ``openAPIV3Schema`` of the served ``v1alpha1`` version of a TrainJob CRD, or ``None``."""
    versions = as_map(as_map(crd).get("spec")).get("versions")
    for version in versions if isinstance(versions, list) else []:
        v = as_map(version)
        if v.get("name") == TRAINER_VERSION and v.get("served") is not False:
            schema = as_map(as_map(v.get("schema")).get("openAPIV3Schema"))
            return schema or None
    return None


def schema_from_openapi(doc: Any) -> Mapping[str, Any] | None:
    """The TrainJob schema of the OpenAPI v3 document of ``/apis/trainer.kubeflow.org/v1alpha1``, with
    ``$ref``s resolved as they are met, or ``None``."""
    schemas = as_map(as_map(as_map(doc).get("components")).get("schemas"))
    for schema in schemas.values():
        for gvk in as_map(schema).get("x-kubernetes-group-version-kind") or []:
            g = as_map(gvk)
            if (g.get("group"), g.get("version"), g.get("kind")) == (
                TRAINER_GROUP,
                TRAINER_VERSION,
                "TrainJob",
            ):
                return _Resolved(schemas).of(schema)
    return None


class _Resolved:
    """Follows ``$ref: #/components/schemas/<name>`` (also inside a one-element ``allOf``)."""

    def __init__(self, schemas: Mapping[str, Any]) -> None:
        self._schemas = schemas

    def of(self, schema: Any, depth: int = 0) -> Mapping[str, Any]:
        node = as_map(schema)
        if depth > 32:
            return {}
        all_of = node.get("allOf")
        if "$ref" not in node and isinstance(all_of, list) and len(all_of) == 1:
            node = {**node, **as_map(all_of[0])}
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/components/schemas/"):
            return self.of(self._schemas.get(ref.rsplit("/", 1)[1]), depth + 1)
        props = as_map(node.get("properties"))
        if props:
            node = {**node, "properties": {k: self.of(v, depth + 1) for k, v in props.items()}}
        return node


def _type_of(node: Mapping[str, Any]) -> str | None:
    if node.get("x-kubernetes-int-or-string") is True:
        return "int-or-string"
    t = node.get("type")
    return t if isinstance(t, str) else None


def missing_fields(schema: Mapping[str, Any]) -> list[str]:
    """One reason for each field of :data:`SENT_FIELDS` the schema lacks (or types otherwise), naming the
    field and the Trainer version that has it. A level that preserves unknown fields without listing
    properties counts as having them (such a server keeps whatever is sent)."""
    reasons = []
    for dotted, release, json_type in SENT_FIELDS:
        node: Mapping[str, Any] = schema
        found = True
        for part in dotted.split("."):
            props = as_map(node.get("properties"))
            if not props and node.get("x-kubernetes-preserve-unknown-fields") is True:
                node = {}
                break
            if part not in props:
                found = False
                break
            node = as_map(props[part])
        if not found:
            reasons.append(
                f"the cluster's TrainJob schema has no {dotted}, which dispatch sends: it needs Kubeflow Trainer "
                f"{release} or later (dispatch is built for v2.3); upgrade Trainer (its CRDs)"
            )
            continue
        got = _type_of(node)
        if json_type is not None and got is not None and got != json_type:
            reasons.append(
                f"the cluster's TrainJob schema types {dotted} as {got}, dispatch sends {json_type}: it needs "
                f"Kubeflow Trainer {release} or later (dispatch is built for v2.3); upgrade Trainer (its CRDs)"
            )
    return reasons
