"""The backend conformance suite against the ``memory`` adapter."""

from collections.abc import AsyncIterator

import pytest

from dispatch.conformance import *  # noqa: F403
from dispatch.conformance import MemoryHarness


@pytest.fixture
async def harness() -> AsyncIterator[MemoryHarness]:
    h = MemoryHarness()
    yield h
    await h.close()
