"""How a refusing admission webhook looks to a client: the API server wraps the webhook's answer.

A controller-runtime validator that returns a plain error is answered with 403 ``Forbidden``; the API
server prefixes the message with ``admission webhook "<name>" denied the request: ``.
"""

from __future__ import annotations

from kubesim.errors import ApiError, Cause

__all__ = ["aggregate", "denied"]


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
