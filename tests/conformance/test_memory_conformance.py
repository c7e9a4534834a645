"""The backend conformance suite against the ``memory`` adapter."""

import pytest

from dispatch.conformance import *  # noqa: F403
from dispatch.conformance import MemoryHarness


@pytest.fixture
def harness() -> MemoryHarness:
    return MemoryHarness()  # a plain fixture, as docs/conformance.md shows: the suite closes it


def test_the_memory_harness_is_a_harness() -> None:
    from dispatch.conformance import INJECTABLE, Harness

    h = MemoryHarness()
    assert isinstance(h, Harness)
    assert h.injects == INJECTABLE
