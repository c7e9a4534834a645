"""JSON types of nested fields, checked as the apiextensions structural-schema validator does.

A schema here is a small dict: ``{"type": "object"|"array"|"string"|"integer"|"boolean"|"quantity"}`` with
``properties`` (named fields of an object), ``values`` (every value of a map) or ``items`` (every item of
an array). Fields the schema does not name are not checked. Only the shapes kubesim's admission and
controllers read need describing: a wrong type there must be a 422, not a crash further on.
"""

from __future__ import annotations

from typing import Any

from kubesim.errors import Cause

__all__ = [
    "BOOLEAN",
    "INTEGER",
    "STRING",
    "STRING_MAP",
    "array_of",
    "json_type",
    "object_of",
    "prune_nulls",
    "type_causes",
]

Schema = dict[str, Any]

STRING: Schema = {"type": "string"}
INTEGER: Schema = {"type": "integer"}
BOOLEAN: Schema = {"type": "boolean"}
STRING_MAP: Schema = {"type": "object", "values": STRING}


def object_of(**properties: Schema) -> Schema:
    """An object whose named fields have the given schemas."""
    return {"type": "object", "properties": properties}


def array_of(items: Schema) -> Schema:
    """An array whose items all have the given schema."""
    return {"type": "array", "items": items}


def json_type(value: Any) -> str:
    """The JSON type name of a decoded value, as the schema validator names it."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return "null"


def type_causes(value: Any, schema: Schema, path: str, *, field: bool = True) -> list[Cause]:
    """``FieldValueTypeInvalid`` causes for every value under ``path`` whose type the schema refuses.

    A ``null`` field counts as absent (the API server drops null fields that are not nullable); a ``null``
    array item or map value is a wrong type.
    """
    if value is None and field:
        return []
    got = json_type(value)
    want = schema["type"]
    if want == "quantity":  # a resource quantity: "500m", "1Gi" or a plain number
        if got in ("string", "integer", "number"):
            return []
        want = "string"
    if got != want:
        return [
            Cause(
                path,
                f'Invalid value: "{got}": {path} in body must be of type {want}: "{got}"',
                "FieldValueTypeInvalid",
            )
        ]
    causes: list[Cause] = []
    if want == "object":
        for key, sub in (schema.get("properties") or {}).items():
            causes += type_causes(value.get(key), sub, f"{path}.{key}")
        if "values" in schema:
            for key, item in value.items():
                causes += type_causes(item, schema["values"], f"{path}.{key}", field=False)
    elif want == "array" and "items" in schema:
        for i, item in enumerate(value):
            causes += type_causes(item, schema["items"], f"{path}[{i}]", field=False)
    return causes


def prune_nulls(value: Any) -> Any:
    """A copy without null-valued object fields, as the API server prunes non-nullable nulls of a CR."""
    if isinstance(value, dict):
        return {k: prune_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [prune_nulls(v) for v in value]
    return value
