"""The errors of the dispatch public API.

Callers test with ``except`` / ``isinstance`` against these classes; they are the Python form of
sentinel errors. No other exception type escapes the public API for a foreseeable failure.
This module is a leaf: it imports nothing else from ``dispatch``.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "BusyError",
    "ConflictError",
    "DispatchError",
    "InvalidError",
    "NotFoundError",
    "OtherClusterError",
    "OutcomeUnknownError",
    "PermissionDeniedError",
    "ReadOnlyError",
    "UnavailableError",
    "UnsupportedError",
]


class DispatchError(Exception):
    """Base class of every error dispatch raises on purpose."""


class InvalidError(DispatchError, ValueError):
    """The request, spec or settings are malformed.

    ``path`` names the offending field when there is one (e.g. ``extensions["dispatch/Image"].ref``).
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        self.path = path
        self.detail = message
        super().__init__(f"{path}: {message}" if path else message)


class UnsupportedError(DispatchError):
    """Well-formed, but this cluster cannot do it. ``reasons`` lists every reason, not just the first."""

    def __init__(self, reasons: str | Iterable[str]) -> None:
        self.reasons: list[str] = [reasons] if isinstance(reasons, str) else list(reasons)
        if not self.reasons:
            self.reasons = ["unsupported"]
        if len(self.reasons) == 1:
            text = self.reasons[0]
        else:
            text = f"{len(self.reasons)} reasons:\n" + "\n".join(f"  - {r}" for r in self.reasons)
        super().__init__(text)


class ReadOnlyError(UnsupportedError):
    """A write was attempted on a read-only or observe-only backend."""


class NotFoundError(DispatchError):
    """No such job or object."""


class ConflictError(DispatchError):
    """The state changed under the caller: a stale revision, a hold that is not yours, a name taken
    by another identity."""


class OtherClusterError(ConflictError):
    """The record belongs to another cluster than the one this process opened: only a process opened on
    the record's own cluster changes it. ``cluster`` names the record's cluster."""

    def __init__(self, job_id: str, cluster: str) -> None:
        super().__init__(
            f"job {job_id!r} belongs to cluster {cluster or '(unknown)'} (not this one): "
            "open that cluster to change it, or `dispatch forget` it if that cluster is gone"
        )
        self.job_id = job_id
        self.cluster = cluster


class BusyError(DispatchError):
    """The operation cannot complete *yet*; retry later (e.g. pods are still terminating)."""


class OutcomeUnknownError(DispatchError):
    """A write may or may not have taken effect; observe before acting again."""


class UnavailableError(DispatchError):
    """The cluster or store could not be reached, after bounded retries."""


class PermissionDeniedError(DispatchError):
    """The credentials do not allow the call."""
