"""Invariants of the memory cluster under random operations (hypothesis)."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatch import ConflictError, Epoch, Identity, JobSpec, ManualClock, NotFoundError, State
from dispatch.backend import place
from dispatch.memory import MemoryBackend, MemorySettings

SCRIPTS = [
    "sleep 3",
    "sleep 2; exit 4",
    "hang",
    "sleep 1; oom",
    "rank=1: sleep 1; rank=1: preempt; sleep 5",
    "slow-stop 4; hang",
]

actions = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.integers(0, 5), st.integers(1, 3), st.booleans()),
        st.tuples(st.just("advance"), st.sampled_from([0.5, 1, 2, 7])),
        st.tuples(
            st.sampled_from(["stop", "hold", "release", "preempt", "lose_node", "vanish"]), st.integers(0, 20)
        ),
    ),
    max_size=40,
)


async def run(ops: list[Any]) -> None:
    clock = ManualClock()
    backend = MemoryBackend(MemorySettings(nodes=3, start_delay=1, cessation_delay=2), clock=clock)
    handles = []
    tokens: dict[str, str] = {}
    for op in ops:
        kind = op[0]
        if kind == "start":
            _, script, nodes, held = op
            # a requeue of the previous job id half of the time: several incarnations per job
            job_id = f"j{len(handles) // 2}"
            epoch = Epoch(1 + len(handles) % 2, len(handles) % 2)
            spec = JobSpec(("x",), nodes=nodes, env={"KUBESIM_SCRIPT": SCRIPTS[script]})
            handles.append(await place(backend, spec, Identity(job_id, epoch), held=held))
        elif kind == "advance":
            clock.advance(op[1])
        elif handles:
            handle = handles[op[1] % len(handles)]
            try:
                if kind == "stop":
                    await backend.stop(handle)
                elif kind == "hold":
                    tokens[handle.ref] = await backend.hold(handle)
                elif kind == "release":
                    await backend.release(handle, tokens.get(handle.ref, "none"))  # type: ignore[arg-type]
                elif kind == "vanish":
                    await backend.vanish(handle)
                else:
                    await getattr(backend, kind)(handle)
            except (ConflictError, NotFoundError):
                pass  # not in a state for it: the cluster refused, as it should
        check(backend)
    clock.advance(100)
    check(backend)
    # every change, replayed from the start: per incarnation, real changes only, ending at the current
    # outcome; nothing after a terminal outcome but "lost" for a vanished object
    current = {o.handle.ref: o.outcome for o in await backend.list()}
    sentinel = await place(backend, JobSpec(("x",)), Identity("sentinel"), held=True)
    stream = backend.watch("0")
    log = []
    async with asyncio.timeout(10):  # a safety net only: the sentinel's change is the last one
        async for change in stream:
            if change.handle == sentinel:
                break
            log.append(change)
    await stream.aclose()  # type: ignore[attr-defined]
    per: dict[str, list[Any]] = {}
    for change in log:
        per.setdefault(change.handle.ref, []).append(change.observation.outcome)
    for ref, outcomes in per.items():
        for a, b in itertools.pairwise(outcomes):
            assert a != b
            assert not a.terminal or b.state is State.LOST
        if ref in current:
            assert outcomes[-1] == current[ref]


def check(backend: MemoryBackend) -> None:
    used: list[str] = []
    for obj in backend.objects():
        used += obj["status"]["nodes"]
        if obj["status"]["state"] in ("starting", "running"):
            assert len(obj["status"]["nodes"]) == obj["spec"]["nodes"]
    assert len(used) == len(set(used)) <= 3


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions)
def test_random_operations_keep_the_invariants(ops: list[Any]) -> None:
    asyncio.run(run(ops))
