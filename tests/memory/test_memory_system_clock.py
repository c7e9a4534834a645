"""The memory backend on the real clock (what ``factory`` uses): waits sleep, and wake on events.

No timed assertions: every wait is bounded by ``asyncio.timeout`` only so a bug fails instead of hanging.
"""

from __future__ import annotations

import asyncio

import dispatch
from dispatch import AdapterConfig, Identity, JobSpec, State
from dispatch.backend import place
from dispatch.memory import MemoryBackend


async def test_a_job_runs_to_its_end_on_the_system_clock() -> None:
    settings = b'{"startDelay": 0, "cessationDelay": 0.01, "defaultScript": "sleep 0.02; exit 0"}'
    backend = await dispatch.new_backend("memory", AdapterConfig("memory", settings))
    assert isinstance(backend, MemoryBackend)
    handle = await place(backend, JobSpec(("x",)), Identity("real"))
    seen = []
    async with asyncio.timeout(10):
        async for change in backend.watch():
            seen.append(change.observation.state)
            if change.observation.outcome.terminal:
                break
    assert seen[-1] is State.SUCCEEDED
    assert State.RUNNING in seen
    assert await backend.ceased(handle)


async def test_wait_ceased_wakes_on_stop_then_sleeps_out_the_delay() -> None:
    settings = b'{"startDelay": 0, "cessationDelay": 0.02}'
    backend = await dispatch.new_backend("memory", AdapterConfig("memory", settings))
    assert isinstance(backend, MemoryBackend)
    handle = await place(backend, JobSpec(("x",), env={"KUBESIM_SCRIPT": "hang"}), Identity("real-stop"))
    waiter = asyncio.ensure_future(backend.wait_ceased(handle))
    await asyncio.sleep(0)
    assert not waiter.done()
    await backend.stop(handle)
    async with asyncio.timeout(10):
        await waiter
    assert await backend.ceased(handle)
