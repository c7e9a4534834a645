"""Fixtures for the memory adapter's own tests: a manual clock and a backend factory on it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from dispatch import JobSpec, ManualClock
from dispatch.memory import MemoryBackend, parse_settings


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def make(clock: ManualClock) -> Callable[..., MemoryBackend]:
    """``make(nodes=2, startDelay=...)``: a memory backend on the test's manual clock."""

    def build(**settings: object) -> MemoryBackend:
        return MemoryBackend(parse_settings(json.dumps(settings)), clock=clock)

    return build


def _job(script: str | None = None, *, nodes: int = 1, **fields: Any) -> JobSpec:
    env = {} if script is None else {"KUBESIM_SCRIPT": script}
    return JobSpec(command=("train",), nodes=nodes, env=env, **fields)


@pytest.fixture
def job() -> Callable[..., JobSpec]:
    """``job(script=None, *, nodes=1, **JobSpec fields)``: a spec running ``script`` (default behaviour
    when None)."""
    return _job
