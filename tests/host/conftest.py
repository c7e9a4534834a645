"""Fixtures for the host tests: a Cluster over the memory backend and a MemoryStore, on a ManualClock."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from dispatch import ManualClock
from dispatch.cluster import Cluster
from dispatch.memory import MemoryBackend
from dispatch.records import MemoryStore

from .helpers import SETTINGS


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def backend(clock: ManualClock) -> MemoryBackend:
    return MemoryBackend(SETTINGS, clock=clock)


@pytest.fixture
def store(clock: ManualClock) -> MemoryStore:
    return MemoryStore(clock)


@pytest.fixture
async def cluster(backend: MemoryBackend, store: MemoryStore, clock: ManualClock) -> AsyncIterator[Cluster]:
    async with Cluster(backend, store, clock=clock) as c:
        yield c
