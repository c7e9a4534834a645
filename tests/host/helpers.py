"""Helpers of the host tests."""

from __future__ import annotations

import asyncio

from dispatch import Image, JobSpec
from dispatch.memory import MemorySettings

# start 1 s, cessation 2 s: known delays on a manual clock make every step deterministic.
SETTINGS = MemorySettings(nodes=4, start_delay=1.0, cessation_delay=2.0, image_pull_grace=5.0)


def spec(script: str = "sleep 5; exit 0", *, nodes: int = 1) -> JobSpec:
    """A job for the memory cluster that does what ``script`` says."""
    return JobSpec(
        command=("python", "train.py"),
        nodes=nodes,
        env={"KUBESIM_SCRIPT": script},
        extensions=[Image("pytorch/pytorch:2.5")],
    )


async def settle(rounds: int = 20) -> None:
    """Let every task that can run, run (no time passes on the manual clock)."""
    for _ in range(rounds):
        await asyncio.sleep(0)
