"""How a refusing admission webhook looks to a client: the API server wraps the webhook's answer.

A controller-runtime validator that returns a plain error is answered with 403 ``Forbidden``; the API
server prefixes the message with ``admission webhook "<name>" denied the request: ``.
"""

from __future__ import annotations

from kubesim.errors import ApiError, Cause, internal

__all__ = ["TRAINER_DEFAULTER", "aggregate", "call_failed", "denied"]

TRAINER_DEFAULTER = (
    "defaulter.trainjob.trainer.kubeflow.org",
    "https://kubeflow-trainer-controller-manager.kubeflow-system.svc:443/mutate-trainer-kubeflow-org-v1alpha1-trainjob",
)
"""Trainer's mutating TrainJob webhook (name, URL): the first of its webhooks the API server calls."""


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


def call_failed(webhook: tuple[str, str], error: str) -> ApiError:
    """What a client sees when the API server cannot call a ``failurePolicy: Fail`` webhook: 500
    InternalError (``k8s.io/apiserver/pkg/admission/plugin/webhook/errors``, wrapped by
    ``apierrors.NewInternalError``), the call's URL carrying the server's ``?timeout=10s``."""
    name, url = webhook
    return internal(
        f'failed calling webhook "{name}": failed to call webhook: Post "{url}?timeout=10s": {error}'
    )
