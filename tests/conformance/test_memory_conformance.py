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


def test_the_memory_harness_is_a_harness() -> None:
    from dispatch.conformance import INJECTABLE, Harness

    h = MemoryHarness()
    assert isinstance(h, Harness)
    assert h.injects == INJECTABLE
