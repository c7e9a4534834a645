"""Fixtures: every contract test runs against each store implementation."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from dispatch import ManualClock, Store
from dispatch.records import MemoryStore, SqliteStore


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, clock: ManualClock, tmp_path: Path) -> AsyncIterator[Store]:
    s: Store
    if request.param == "memory":
        s = MemoryStore(clock=clock)
    else:
        s = SqliteStore(tmp_path / "state" / "jobs.db", clock=clock)
    yield s
    await s.close()
