"""The store-wide gauges of the supervisor, from one listing of the records (pure).

Every supervisor counts the whole store (lists it at each scan; a fleet member asks the store for its
counts by state and lists its starting records at each resync), so each exports the same store-wide
figures; dashboards and alerts aggregate them with ``max`` (never ``sum``), see
docs/operations.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dispatch.model import JobRecord, State

__all__ = ["Tally", "oldest", "tally"]


@dataclass(frozen=True, slots=True)
class Tally:
    """Records by state; since when each starting incarnation has been seen starting; the oldest age."""

    counts: dict[str, float]
    starting_since: dict[tuple[str, int], float]
    oldest_starting: float


def tally(
    records: Iterable[JobRecord],
    since: Mapping[tuple[str, int], float],
    now: float,
    *,
    counts: Mapping[State, int] | None = None,
) -> Tally:
    """Count ``records`` by state (or take ``counts``, the store's own count by state: ``records`` then
    need hold only the starting ones), and age the starting ones: an incarnation (job id, epoch) keeps
    the time it was first seen starting (``since``, from the previous scan); the others are forgotten. A
    record carries no "starting since" of its own, so the age counts from this process's first sight."""
    counted: dict[str, float] = {}
    if counts is not None:
        counted = {state.value: float(n) for state, n in counts.items()}
    starting: dict[tuple[str, int], float] = {}
    for rec in records:
        if counts is None:
            counted[rec.state.value] = counted.get(rec.state.value, 0.0) + 1
        if rec.state is State.STARTING:
            key = (rec.job_id, rec.epoch.n)
            starting[key] = since.get(key, now)
    return Tally(counted, starting, oldest(starting, now))


def oldest(since: Mapping[tuple[str, int], float], now: float) -> float:
    """The age of the oldest starting incarnation at ``now`` (0 when none is starting)."""
    return max((now - t for t in since.values()), default=0.0)
