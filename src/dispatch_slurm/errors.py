"""The Slurm adapter's own errors (subclasses of dispatch's, so callers need not know them)."""

from __future__ import annotations

from dispatch.errors import ConflictError

__all__ = ["StaleHoldError"]


class StaleHoldError(ConflictError):
    """A release whose hold token no longer matches the start time Slurm shows (someone released or
    held the job again), or a job that is no longer held."""
