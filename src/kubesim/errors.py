"""API errors as a real kube-apiserver reports them: an HTTP code plus a ``metav1.Status`` body.

Messages follow apimachinery's wording (``pods "x" not found``, ``Operation cannot be fulfilled on ...``,
``<Kind>.<group> "<name>" is invalid: <field>: <msg>``) because clients and people match on them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kubesim.resources import ResourceType

__all__ = [
    "ApiError",
    "Cause",
    "already_exists",
    "bad_request",
    "conflict",
    "expired",
    "field_value",
    "forbidden",
    "gone",
    "internal",
    "invalid",
    "method_not_allowed",
    "not_found",
    "too_many_requests",
    "unauthorized",
    "unsupported_media_type",
]


class ApiError(Exception):
    """An error answered by the API: ``code`` (HTTP), ``reason`` (metav1.StatusReason), ``message``."""

    def __init__(
        self, code: int, reason: str, message: str, *, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def __repr__(self) -> str:
        return f"ApiError({self.code}, {self.reason!r}, {self.message!r})"

    def status(self) -> dict[str, Any]:
        """The full ``metav1.Status`` body a real server sends with this error."""
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
        }
        if self.details:
            body["details"] = self.details
        body["code"] = self.code
        return body


@dataclass(frozen=True)
class Cause:
    """One field error of a 422 Invalid answer (a ``metav1.StatusCause``).

    ``message`` is the body after the field path (e.g. ``Required value``,
    ``Invalid value: "x": must be ...``); ``reason`` is the cause type (``FieldValueInvalid``, ...).
    """

    field: str
    message: str
    reason: str = "FieldValueInvalid"

    def as_dict(self) -> dict[str, str]:
        return {"reason": self.reason, "message": self.message, "field": self.field}

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"

    # Constructors named after apimachinery's field.ErrorList helpers.
    @staticmethod
    def invalid_value(field: str, value: Any, detail: str) -> Cause:
        body = f"Invalid value: {field_value(value)}"
        if detail:
            body += f": {detail}"
        return Cause(field, body, "FieldValueInvalid")

    @staticmethod
    def invalid_detail(field: str, detail: str) -> Cause:
        """An Invalid value whose value is omitted (as CEL rules at the schema root report it)."""
        return Cause(field, f"Invalid value: {detail}", "FieldValueInvalid")

    @staticmethod
    def required(field: str, detail: str = "") -> Cause:
        return Cause(field, "Required value" + (f": {detail}" if detail else ""), "FieldValueRequired")

    @staticmethod
    def forbidden(field: str, detail: str) -> Cause:
        return Cause(field, f"Forbidden: {detail}", "FieldValueForbidden")

    @staticmethod
    def too_long(field: str, max_length: int) -> Cause:
        return Cause(field, f"Too long: may not be more than {max_length} bytes", "FieldValueTooLong")

    @staticmethod
    def too_many(field: str, actual: int, max_items: int) -> Cause:
        return Cause(field, f"Too many: {actual}: must have at most {max_items} items", "FieldValueTooMany")

    @staticmethod
    def not_supported(field: str, value: Any, supported: list[str]) -> Cause:
        allowed = ", ".join(json.dumps(s) for s in supported)
        return Cause(
            field,
            f"Unsupported value: {field_value(value)}: supported values: {allowed}",
            "FieldValueNotSupported",
        )

    @staticmethod
    def duplicate(field: str, value: Any) -> Cause:
        return Cause(field, f"Duplicate value: {field_value(value)}", "FieldValueDuplicate")


def field_value(value: Any) -> str:
    """A bad value as Kubernetes field errors print it (strings quoted; objects as compact JSON)."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _qualified(rt: ResourceType) -> str:
    return f"{rt.plural}.{rt.group}" if rt.group else rt.plural


def _details(rt: ResourceType, name: str | None) -> dict[str, Any]:
    d: dict[str, Any] = {}
    if name:
        d["name"] = name
    if rt.group:
        d["group"] = rt.group
    d["kind"] = rt.plural
    return d


def not_found(rt: ResourceType, name: str) -> ApiError:
    """404 ``<plural>[.<group>] "<name>" not found``."""
    return ApiError(404, "NotFound", f'{_qualified(rt)} "{name}" not found', details=_details(rt, name))


def cached_not_found_message(rt: ResourceType, name: str) -> str:
    """NotFound as a controller-runtime client reading through its cache words it: the *Kind* where the
    apiserver names the resource (``cache_reader.go`` builds the GroupResource from the GVK's Kind):
    ``ClusterTrainingRuntime.trainer.kubeflow.org "x" not found``. What Trainer's webhook and controller
    report for a missing runtime."""
    return f'{rt.kind}.{rt.group} "{name}" not found' if rt.group else f'{rt.kind} "{name}" not found'


def already_exists(rt: ResourceType, name: str) -> ApiError:
    """409 ``<plural>[.<group>] "<name>" already exists``."""
    return ApiError(
        409, "AlreadyExists", f'{_qualified(rt)} "{name}" already exists', details=_details(rt, name)
    )


CONFLICT_MODIFIED = (
    "the object has been modified; please apply your changes to the latest version and try again"
)


def conflict(rt: ResourceType, name: str, msg: str = CONFLICT_MODIFIED) -> ApiError:
    """409 Conflict ``Operation cannot be fulfilled on <plural> "<name>": <msg>``."""
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(rt)} "{name}": {msg}',
        details=_details(rt, name),
    )


def invalid(rt: ResourceType, name: str, causes: list[Cause]) -> ApiError:
    """422 Invalid with field causes, message ``<Kind>.<group> "<name>" is invalid: <causes>``."""
    qualified_kind = f"{rt.kind}.{rt.group}" if rt.group else rt.kind
    if not causes:
        message = f'{qualified_kind} "{name}" is invalid'
    elif len(causes) == 1:
        message = f'{qualified_kind} "{name}" is invalid: {causes[0]}'
    else:
        message = f'{qualified_kind} "{name}" is invalid: [{", ".join(str(c) for c in causes)}]'
    details: dict[str, Any] = {"name": name}
    if rt.group:
        details["group"] = rt.group
    details["kind"] = rt.kind
    details["causes"] = [c.as_dict() for c in causes]
    return ApiError(422, "Invalid", message, details=details)


def forbidden(
    user: str,
    verb: str,
    rt: ResourceType | None,
    *,
    namespace: str | None = None,
    name: str | None = None,
    subresource: str | None = None,
    path: str | None = None,
) -> ApiError:
    """403 Forbidden worded like the RBAC authorizer's refusal."""
    if rt is None:
        return ApiError(
            403,
            "Forbidden",
            f'forbidden: User "{user}" cannot {verb} path "{path or "/"}"',
            details={},
        )
    resource = rt.plural + (f"/{subresource}" if subresource else "")
    subject = f'{_qualified(rt)} "{name}"' if name else _qualified(rt)
    scope = f'in the namespace "{namespace}"' if namespace else "at the cluster scope"
    msg = (
        f'{subject} is forbidden: User "{user}" cannot {verb} resource "{resource}" '
        f'in API group "{rt.group}" {scope}'
    )
    return ApiError(403, "Forbidden", msg, details=_details(rt, name))


def unauthorized() -> ApiError:
    """401 Unauthorized (no or unknown bearer token)."""
    return ApiError(401, "Unauthorized", "Unauthorized")


def expired(msg: str) -> ApiError:
    """410 with reason ``Expired`` (a too-old resourceVersion or continue token)."""
    return ApiError(410, "Expired", msg)


def gone(msg: str) -> ApiError:
    """410 Gone: ``Expired`` as a watch/list reports a compacted resourceVersion."""
    return expired(msg)


def bad_request(msg: str) -> ApiError:
    """400 BadRequest."""
    return ApiError(400, "BadRequest", msg)


def method_not_allowed() -> ApiError:
    """405 MethodNotAllowed."""
    return ApiError(
        405, "MethodNotAllowed", "the server does not allow this method on the requested resource"
    )


def unsupported_media_type(content_type: str) -> ApiError:
    """415 UnsupportedMediaType."""
    return ApiError(
        415, "UnsupportedMediaType", f"the body of the request was in an unknown format: {content_type}"
    )


def too_many_requests(retry_after: int = 1) -> ApiError:
    """429 TooManyRequests with ``details.retryAfterSeconds``."""
    return ApiError(
        429,
        "TooManyRequests",
        "Too many requests, please try again later.",
        details={"retryAfterSeconds": retry_after},
    )


def internal(msg: str) -> ApiError:
    """500 InternalError ``Internal error occurred: <msg>``."""
    return ApiError(
        500, "InternalError", f"Internal error occurred: {msg}", details={"causes": [{"message": msg}]}
    )
