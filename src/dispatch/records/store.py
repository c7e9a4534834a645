"""The :class:`Store` protocol: durable job records with compare-and-swap, leases and history."""

from __future__ import annotations

import builtins
from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from dispatch.model import JobRecord, State, Transition

__all__ = ["KeyValues", "Store"]


@runtime_checkable
class Store(Protocol):
    """One record per job, plus its append-only history of transitions.

    Contract (checked by ``tests/records``, the same tests for every implementation):

    - every write is conditional on the record's ``revision`` (compare-and-swap): a stale write raises
      ``ConflictError`` and changes nothing; a successful one returns the record with ``revision + 1``
      and ``updated_at`` set from the store's clock;
    - a supervisor takes a time-bounded lease on a record before acting on it; an expired lease may be
      taken over by another holder; lease changes are writes (they bump the revision);
    - records are never deleted implicitly; :meth:`purge` is explicit;
    - a write that returned is durable (it survives the process being killed right after).
    """

    async def create(self, record: JobRecord, transition: Transition) -> JobRecord:
        """Insert a new record (stored with revision 1) and its first transition.
        ``ConflictError`` if the job id is taken."""
        ...

    async def get(self, job_id: str) -> JobRecord:
        """The current record. ``NotFoundError`` if there is none."""
        ...

    async def list(self, *, states: Iterable[State] | None = None) -> list[JobRecord]:
        """Every record (optionally only those in ``states``), oldest first."""
        ...

    async def update(
        self, record: JobRecord, *, expected_revision: int, transitions: Sequence[Transition] = ()
    ) -> JobRecord:
        """Replace the record if its stored revision is ``expected_revision``, appending ``transitions``
        atomically with it. ``ConflictError`` if the revision moved, ``NotFoundError`` if it is gone."""
        ...

    async def history(self, job_id: str) -> builtins.list[Transition]:
        """The record's transitions, oldest first. ``NotFoundError`` if there is no record."""
        ...

    async def acquire_lease(self, job_id: str, holder: str, ttl: float) -> JobRecord:
        """Take or renew the lease on a record for ``ttl`` seconds. Succeeds when there is no lease, it
        has expired, or ``holder`` already holds it; otherwise ``ConflictError`` naming the holder."""
        ...

    async def release_lease(self, job_id: str, holder: str) -> JobRecord:
        """Give up a lease held by ``holder``. ``ConflictError`` if another holder has it now."""
        ...

    async def purge(self, older_than: float) -> int:
        """Delete terminal records (and their history) last updated before ``older_than`` (epoch
        seconds). Returns how many were deleted. Non-terminal records are never purged."""
        ...

    async def close(self) -> None:
        """Release the store's resources. Idempotent."""
        ...


@runtime_checkable
class KeyValues(Protocol):
    """Optional small key-value table kept beside the records (``SqliteStore`` and ``MemoryStore`` have
    it; a store without it still satisfies :class:`Store`).

    For host-side caches that must outlive a process and be shared like the records are — today the
    probe findings of an adapter (see :class:`dispatch.config.ProbeCache`). Values are text (JSON by
    convention), at most :data:`MAX_VALUE` characters; keys are non-empty text of at most 512 characters.
    ``put_value`` replaces unconditionally: a cache, not a record (no revision, no history).
    """

    async def get_value(self, key: str) -> str | None:
        """The value stored under ``key``, or ``None``."""
        ...

    async def put_value(self, key: str, value: str | None) -> None:
        """Store ``value`` under ``key`` (``None`` deletes it)."""
        ...


MAX_VALUE = 1 << 20
"""The largest value :class:`KeyValues` keeps (characters)."""


def check_key_value(key: object, value: object) -> None:
    """``InvalidError`` for a key or value :class:`KeyValues` does not keep."""
    from dispatch.errors import InvalidError

    if not isinstance(key, str) or not key or len(key) > 512:
        raise InvalidError("expected a non-empty string of at most 512 characters", path="key")
    if value is not None and (not isinstance(value, str) or len(value) > MAX_VALUE):
        raise InvalidError(f"expected a string of at most {MAX_VALUE} characters, or None", path="value")
