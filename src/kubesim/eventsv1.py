"""``events.k8s.io/v1`` Events: another view of the core/v1 Events the store holds, as on a real server,
where both versions are one storage (``registry/core/event``) and the API converts between them.

Conversion as ``pkg/apis/events/v1/conversion.go``: ``regarding`` ↔ ``involvedObject``, ``note`` ↔
``message``, ``reportingController`` ↔ ``reportingComponent``, ``deprecatedSource``/``deprecated
FirstTimestamp``/``deprecatedLastTimestamp``/``deprecatedCount`` ↔ ``source``/``firstTimestamp``/
``lastTimestamp``/``count``; the rest (``series`` too) keeps its name.
Validation as ``pkg/apis/core/validation/events.go``: core/v1 writes get the legacy rules only, writes
through ``events.k8s.io/v1`` the strict ones too (``eventTime``, ``reportingController``,
``reportingInstance``, ``action``, ``reason`` required; the deprecated fields must be unset).
Pure functions.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from typing import Any

from kubesim.errors import Cause, invalid
from kubesim.resources import ResourceType

__all__ = ["from_v1", "legacy_causes", "legacy_event_admission", "strict_causes", "to_v1", "update_causes"]

# (events.k8s.io/v1 name, core/v1 name) for the fields that are renamed; the others keep their names.
_RENAMED = (
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
)
_SAME = ("metadata", "eventTime", "series", "reportingInstance", "action", "reason", "related", "type")
_QUALIFIED_NAME = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)


def _convert(src: dict[str, Any], api_version: str, renamed: Iterable[tuple[str, str]]) -> dict[str, Any]:
    out: dict[str, Any] = {"kind": "Event", "apiVersion": api_version}
    for name in _SAME:
        if src.get(name) is not None:
            out[name] = copy.deepcopy(src[name])
    for src_name, out_name in renamed:
        if src.get(src_name) not in (None, "", {}):
            out[out_name] = copy.deepcopy(src[src_name])
    return out


def to_v1(core: dict[str, Any]) -> dict[str, Any]:
    """The ``events.k8s.io/v1`` view of a stored core/v1 Event."""
    out = _convert(core, "events.k8s.io/v1", ((c, v) for v, c in _RENAMED))
    out.setdefault("eventTime", None)  # a MicroTime that is never omitted
    return out


def from_v1(event: dict[str, Any]) -> dict[str, Any]:
    """The core/v1 Event stored for an ``events.k8s.io/v1`` one."""
    out = _convert(event, "v1", _RENAMED)
    out.setdefault("involvedObject", {})
    return out


def legacy_causes(core: dict[str, Any]) -> list[Cause]:
    """``legacyValidateEvent``: the rules every Event write obeys, in core/v1 terms."""
    causes: list[Cause] = []
    ns = str((core.get("metadata") or {}).get("namespace") or "")
    involved = core.get("involvedObject") or {}
    obj_ns = str(involved.get("namespace") or "")
    if not core.get("eventTime"):
        if (not obj_ns and ns not in ("", "default")) or (obj_ns and ns != obj_ns):
            causes.append(
                Cause.invalid_value("involvedObject.namespace", obj_ns, "does not match event.namespace")
            )
        return causes
    if not obj_ns and ns not in ("default", "kube-system"):
        causes.append(
            Cause.invalid_value("involvedObject.namespace", obj_ns, "does not match event.namespace")
        )
    controller = str(core.get("reportingComponent") or "")
    if not controller:
        causes.append(Cause.required("reportingController"))
    elif not _QUALIFIED_NAME.match(controller) or len(controller.rsplit("/", 1)[-1]) > 63:
        causes.append(
            Cause.invalid_value(
                "reportingController",
                controller,
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end "
                "with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
                "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')",
            )
        )
    for name, limit in (("reportingInstance", 128), ("action", 128), ("reason", 128)):
        value = str(core.get(name) or "")
        if not value:
            causes.append(Cause.required(name))
        elif len(value) > limit:
            causes.append(Cause.invalid_value(name, "", f"can have at most {limit} characters"))
    if len(str(core.get("message") or "")) > 1024:
        causes.append(Cause.invalid_value("message", "", "can have at most 1024 characters"))
    return causes


def strict_causes(core: dict[str, Any]) -> list[Cause]:
    """``ValidateEventCreate`` for a write through ``events.k8s.io/v1`` (legacy rules included)."""
    causes = legacy_causes(core)
    series = core.get("series")
    if isinstance(series, dict):
        if int(series.get("count") or 0) < 2:
            causes.append(Cause.invalid_value("series.count", "", "should be at least 2"))
        if not series.get("lastObservedTime"):
            causes.append(Cause.required("series.lastObservedTime"))
    if not core.get("eventTime"):
        causes.append(Cause.required("eventTime"))
    if core.get("type") not in ("Normal", "Warning"):
        causes.append(Cause.invalid_value("type", "", f"has invalid value: {core.get('type') or ''}"))
    for name in ("firstTimestamp", "lastTimestamp", "count"):
        if core.get(name):
            causes.append(Cause.invalid_value(name, "", "needs to be unset"))
    if any((core.get("source") or {}).get(k) for k in ("component", "host")):
        causes.append(Cause.invalid_value("source", "", "needs to be unset"))
    return causes


def update_causes(new: dict[str, Any], old: dict[str, Any]) -> list[Cause]:
    """``ValidateEventUpdate`` through ``events.k8s.io/v1``: only ``series`` (and metadata) may change."""
    causes = legacy_causes(new)
    if new.get("series") != old.get("series"):
        causes += [c for c in strict_causes(new) if c.field.startswith("series")]
    for name in (
        "involvedObject",
        "reason",
        "message",
        "source",
        "firstTimestamp",
        "lastTimestamp",
        "count",
        "type",
        "eventTime",
        "action",
        "related",
        "reportingComponent",
        "reportingInstance",
    ):
        if new.get(name) != old.get(name):
            path = "reportingController" if name == "reportingComponent" else name
            causes.append(Cause.invalid_value(path, new.get(name), "field is immutable"))
    return causes


def legacy_event_admission(
    operation: str, rt: ResourceType, obj: dict[str, Any], old: dict[str, Any] | None
) -> None:
    """The Event registry's validation for every write (a store admission hook on core Events)."""
    if operation in ("CREATE", "UPDATE"):
        causes = legacy_causes(obj)
        if causes:
            raise invalid(rt, str((obj.get("metadata") or {}).get("name") or ""), causes)
