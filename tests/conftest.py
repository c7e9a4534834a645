"""Settings for the whole suite: hypothesis without deadlines (a shared, loaded machine makes any
per-example time limit flaky; speed is measured in benchmarks/)."""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("dispatch", deadline=None)
settings.load_profile("dispatch")
