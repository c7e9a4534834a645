"""DeleteOptions as the API server decodes them for a DELETE (and a DELETE of a collection): the JSON body
(``metav1.DeleteOptions``: each field must have its Go type, else 400) and the query parameters, which
win; ``orphanDependents`` is the old spelling of ``propagationPolicy: Orphan``."""

from __future__ import annotations

from typing import Any

from kubesim.bodies import BodyError, decode_json
from kubesim.errors import bad_request
from kubesim.store import check_propagation
from kubesim.watch import query_bool, query_int64

__all__ = ["delete_options"]

# DeleteOptions fields and the JSON types their Go struct decodes (anything else is a 400, as there).
_DELETE_OPTION_TYPES: dict[str, tuple[type, ...]] = {
    "gracePeriodSeconds": (int,),
    "propagationPolicy": (str,),
    "orphanDependents": (bool,),
    "dryRun": (list,),
    "preconditions": (dict,),
}


def _check_types(body: dict[str, Any]) -> None:
    fields: list[tuple[str, Any, tuple[type, ...]]] = [
        (f, body.get(f), types) for f, types in _DELETE_OPTION_TYPES.items()
    ]
    pre = body.get("preconditions")
    if isinstance(pre, dict):
        fields += [(f"preconditions.{f}", pre.get(f), (str,)) for f in ("uid", "resourceVersion")]
    for field, value, types in fields:
        wrong_bool = isinstance(value, bool) and bool not in types
        if value is not None and (wrong_bool or not isinstance(value, types)):
            raise bad_request(
                f"the DeleteOptions body is not valid: {field} must be of type {_GO_TYPE[types[0]]}, "
                f"not {_JSON_NAME.get(type(value), 'null')}"
            )


_GO_TYPE = {int: "int64", str: "string", bool: "bool", list: "[]string", dict: "object"}
_JSON_NAME = {int: "number", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}


def delete_options(raw: bytes, q: dict[str, str]) -> dict[str, Any]:
    """``propagation``, ``grace``, ``dry_run`` (from the body; the query's ``dryRun`` is the caller's),
    ``preconditions`` and ``orphan_false`` (``orphanDependents=false`` was sent: the only case a real
    server answers 202) from a DELETE's body ``raw`` and query ``q``."""
    opts: dict[str, Any] = {
        "propagation": None,
        "grace": None,
        "dry_run": False,
        "preconditions": None,
        "orphan_false": False,  # orphanDependents=false was sent (the only case that answers 202)
    }
    if raw.strip():
        try:
            body = decode_json(raw)
        except BodyError:
            raise bad_request("the DeleteOptions body is not valid JSON") from None
        if isinstance(body, dict):
            _check_types(body)
            opts["propagation"] = body.get("propagationPolicy")
            opts["grace"] = body.get("gracePeriodSeconds")
            opts["preconditions"] = body.get("preconditions")
            dr = body.get("dryRun") or []
            if dr and dr != ["All"]:
                raise bad_request(f'dryRun: Unsupported value: {dr!r}: supported values: "All"')
            opts["dry_run"] = dr == ["All"]
            if body.get("orphanDependents") is True and opts["propagation"] is None:
                opts["propagation"] = "Orphan"
            opts["orphan_false"] = body.get("orphanDependents") is False
    if q.get("propagationPolicy"):
        opts["propagation"] = q["propagationPolicy"]
    g = query_int64(q, "gracePeriodSeconds")
    if g is not None:
        opts["grace"] = g
    if query_bool(q.get("orphanDependents")) and opts["propagation"] is None:
        opts["propagation"] = "Orphan"
    if "orphanDependents" in q and not query_bool(q["orphanDependents"]):
        opts["orphan_false"] = True
    check_propagation(opts["propagation"])
    return opts
