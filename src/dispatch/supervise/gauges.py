"""The store-wide gauges a supervisor exports (records by state, the oldest starting incarnation's
age), from what its scans and resyncs read: :func:`dispatch.tally.tally` counts, this keeps since when
each starting incarnation has been seen starting and hands the figures to the metrics recorder."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dispatch import metrics
from dispatch.model import JobRecord, State
from dispatch.tally import oldest, tally

__all__ = ["Gauges"]


class Gauges:
    def __init__(self) -> None:
        self._starting: dict[tuple[str, int], float] = {}  # incarnation -> first seen starting

    def count(
        self, records: Iterable[JobRecord], now: float, *, counts: Mapping[State, int] | None = None
    ) -> None:
        """Export the counts of ``records`` by state (or the store's own ``counts``, ``records`` then the
        starting ones) and the oldest starting incarnation's age."""
        recorder = metrics.current()
        if recorder.enabled:
            gauges = tally(records, self._starting, now, counts=counts)
            self._starting = gauges.starting_since
            recorder.set_all("dispatch_jobs", "state", gauges.counts, every=(s.value for s in State))
            recorder.set("dispatch_jobs_starting_oldest_seconds", gauges.oldest_starting)

    def age(self, now: float) -> None:
        """Export the oldest starting incarnation's age as of ``now``, the counts as last exported."""
        recorder = metrics.current()
        if recorder.enabled:
            recorder.set("dispatch_jobs_starting_oldest_seconds", oldest(self._starting, now))
