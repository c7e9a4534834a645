"""The adapter's own errors, and how Kubernetes API answers map to dispatch's errors (pure).

The mapping (SPEC §9.7, last paragraph): 404 → NotFoundError, 409 → ConflictError, 422 or a webhook
denial → InvalidError, 401/403 → PermissionDeniedError, 429/5xx/timeouts → UnavailableError once the
bounded retries are spent; a create whose answer was lost → OutcomeUnknownError. A 500 "failed calling
webhook" is a refusal, not a lost answer: nothing was stored, so it is UnavailableError naming the webhook.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dispatch.errors import (
    BusyError,
    ConflictError,
    DispatchError,
    InvalidError,
    NotFoundError,
    OutcomeUnknownError,
    PermissionDeniedError,
    UnavailableError,
)

__all__ = [
    "AlreadyExistsError",
    "ExpiredError",
    "PodsRemainError",
    "StaleHoldError",
    "is_retryable",
    "map_status",
    "map_transport",
    "unavailable_webhook",
]


class StaleHoldError(ConflictError):
    """A release whose hold token no longer matches what the cluster shows, or that targets an older
    incarnation."""


class PodsRemainError(BusyError):
    """The incarnation's pods are still terminating: its compute is not gone yet. Retry later."""


class AlreadyExistsError(ConflictError):
    """A create found an object of that name already there (HTTP 409 ``AlreadyExists``)."""


class ExpiredError(ConflictError):
    """A resourceVersion is too old to list or watch from (HTTP 410 ``Expired``/``Gone``): list again."""


def is_retryable(code: int) -> bool:
    """Answers worth retrying with backoff: throttling and server-side failures."""
    return code == 429 or code >= 500


def _message(body: Mapping[str, Any] | None, code: int) -> str:
    if isinstance(body, Mapping):
        message = body.get("message")
        if isinstance(message, str) and message:
            return message
    return f"HTTP {code}"


def _reason(body: Mapping[str, Any] | None) -> str:
    reason = body.get("reason") if isinstance(body, Mapping) else None
    return reason if isinstance(reason, str) else ""


def _webhook_denial(message: str) -> bool:
    return "admission webhook" in message and "denied the request" in message


_WEBHOOK_CALL = r'failed calling webhook "([^"]+)"'


def unavailable_webhook(message: str) -> str | None:
    """The webhook an API server could not call (HTTP 500 ``failed calling webhook "<name>": ...``), or
    ``None``. The server refused the request before storing anything: a write it answers so had no
    effect, unlike a lost answer."""
    found = re.search(_WEBHOOK_CALL, message)
    return found.group(1) if found else None


def map_status(code: int, body: Mapping[str, Any] | None, *, what: str) -> DispatchError:
    """The dispatch error for an API answer ``code`` with ``metav1.Status`` ``body``, about ``what``
    (e.g. ``create TrainJob "x" in namespace "team-a"``). The message names the object and says what
    to do; it carries the server's message, never a credential."""
    message = _message(body, code)
    reason = _reason(body)
    if code == 404:
        return NotFoundError(f"{what}: not found ({message})")
    if code == 409 and reason == "AlreadyExists":
        return AlreadyExistsError(f"{what}: it already exists ({message})")
    if code == 409:
        return ConflictError(f"{what}: conflict ({message}); observe again before retrying")
    if code == 422 or code == 400 or _webhook_denial(message):
        return InvalidError(f"{what}: the cluster refused it as invalid: {message}")
    if code == 401:
        return PermissionDeniedError(
            f"{what}: the credentials were not accepted (401 {reason or 'Unauthorized'}): {message}"
        )
    if code == 403:
        return PermissionDeniedError(
            f"{what}: forbidden ({message}); grant the credentials this permission (see the adapter's RBAC docs)"
        )
    if code == 410:
        return ExpiredError(f"{what}: the resource version expired ({message}); list again")
    webhook = unavailable_webhook(message) if code >= 500 else None
    if webhook is not None:
        return UnavailableError(
            f"{what}: the cluster's admission webhook {webhook!r} could not be called, so the request was "
            f"refused and nothing was created (HTTP {code}: {message}); bring the webhook's service back "
            "(for Trainer's: the kubeflow-trainer controller)"
        )
    if is_retryable(code):
        return UnavailableError(
            f"{what}: the cluster kept failing (HTTP {code} {reason}: {message}); try again later"
        )
    return UnavailableError(f"{what}: unexpected answer HTTP {code} {reason}: {message}")


def map_transport(what: str, detail: str, *, ambiguous_write: bool) -> DispatchError:
    """The dispatch error for a request that got no usable answer after the retries: an
    :class:`OutcomeUnknownError` if it was a write that may have reached the server, else
    :class:`UnavailableError`."""
    if ambiguous_write:
        return OutcomeUnknownError(
            f"{what}: the answer was lost ({detail}); it may or may not have taken effect: observe before acting again"
        )
    return UnavailableError(f"{what}: the cluster could not be reached ({detail}); try again later")
