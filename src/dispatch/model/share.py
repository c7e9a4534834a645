"""A fleet member's share of the jobs: :class:`Share`, and how jobs are split (pure).

A job id falls in one of :data:`BUCKETS` buckets (a hash of the id: :func:`bucket`); each bucket belongs
to the live member with the highest hash of member name and bucket (rendezvous hashing, :func:`owner`),
so N members split the buckets — hence the jobs — evenly, and a member joining or leaving moves only
its own share. A share is a set of buckets, a value: what a member asks a watch for, as a label
selector asks an API server for the objects of some label values, so that a change of another member's
job is not decoded, sent or even built for it.
"""

from __future__ import annotations

import functools
import hashlib

from dispatch.errors import InvalidError
from dispatch.model._base import Model

__all__ = ["BUCKETS", "Share", "bucket", "owner"]

BUCKETS = 4096
"""How many buckets the job ids fall in: enough that N members' shares are even within a few per cent."""


@functools.lru_cache(maxsize=1 << 16)
def bucket(job_id: str) -> int:
    """The bucket of ``job_id`` (0 to ``BUCKETS - 1``): the same in every process and every release."""
    digest = hashlib.blake2b(job_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % BUCKETS


def owner(bucket: int, members: tuple[str, ...]) -> str:
    """The member a bucket belongs to: the highest hash of member and bucket (rendezvous hashing)."""
    return max(members, key=lambda m: hashlib.blake2b(f"{m}\x00{bucket}".encode(), digest_size=8).digest())


class Share(Model, frozen=True):
    """The jobs one member of a fleet looks after: those whose :func:`bucket` is in ``buckets``."""

    json_path = "share"

    buckets: frozenset[int]

    def __post_init__(self) -> None:
        for b in self.buckets:
            if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b < BUCKETS:
                raise InvalidError(f"expected buckets from 0 to {BUCKETS - 1}, got {b!r}", path="buckets")

    @classmethod
    def of(cls, member: str, members: tuple[str, ...]) -> Share:
        """The share of ``member`` among the live ``members`` (``member`` among them)."""
        if member not in members:
            raise InvalidError(f"{member!r} is not among the members {list(members)!r}", path="member")
        return cls(frozenset(b for b in range(BUCKETS) if owner(b, members) == member))

    def holds(self, job_id: str) -> bool:
        """Whether job ``job_id`` is in this share."""
        return bucket(job_id) in self.buckets
