"""How a refusing admission webhook looks to a client: the API server wraps the webhook's answer.

A controller-runtime validator that returns a plain error is answered with 403 ``Forbidden``; the API
server prefixes the message with ``admission webhook "<name>" denied the request: ``.
"""

from __future__ import annotations

import json
from typing import Any

from kubesim.errors import ApiError, Cause

__all__ = ["aggregate", "denied", "go_value"]


def go_value(value: Any) -> str:
    """A bad value as field errors print it (strings quoted; objects as compact JSON)."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def aggregate(causes: list[Cause]) -> str:
    """``utilerrors.Aggregate`` text: one error alone, several as ``[a, b]`` (duplicates dropped)."""
    texts: list[str] = []
    for c in causes:
        t = str(c)
        if t not in texts:
            texts.append(t)
    if len(texts) == 1:
        return texts[0]
    return "[" + ", ".join(texts) + "]"


def denied(webhook: str, message: str, *, code: int = 403) -> ApiError:
    """The error a client sees when webhook ``webhook`` denies the request with ``message``."""
    reason = "Forbidden" if code == 403 else "BadRequest"
    return ApiError(code, reason, f'admission webhook "{webhook}" denied the request: {message}')
