"""Random sequences of operator calls and cluster time on the memory backend: the facade's invariants."""

from __future__ import annotations

import asyncio

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dispatch import BusyError, Cause, ConflictError, ManualClock, State, UnsupportedError
from dispatch.cluster import Cluster
from dispatch.memory import MemoryBackend
from dispatch.records import MemoryStore

from .helpers import SETTINGS, spec

JOBS = ["a", "b"]
SCRIPTS = ["sleep 2; exit 0", "sleep 1; exit 2", "sleep 1; preempt", "hang", "slow-stop 4; sleep 3; oom"]

ops = st.one_of(
    st.tuples(st.just("submit"), st.sampled_from(JOBS), st.sampled_from(SCRIPTS), st.booleans()),
    st.tuples(st.sampled_from(["cancel", "hold", "release", "resubmit", "get"]), st.sampled_from(JOBS)),
    st.tuples(st.just("advance"), st.sampled_from([0.5, 1.0, 3.0])),
    st.tuples(st.just("list")),
)

EXPECTED = (ConflictError, BusyError, UnsupportedError)


async def play(program: list[tuple[object, ...]]) -> None:
    clock = ManualClock()
    backend = MemoryBackend(SETTINGS, clock=clock)
    store = MemoryStore(clock)
    revisions: dict[str, int] = {}
    async with Cluster(backend, store, clock=clock) as cluster:
        for op in program:
            name = op[0]
            try:
                if name == "submit":
                    await cluster.submit(spec(str(op[2])), job_id=str(op[1]), held=bool(op[3]))
                elif name == "advance":
                    clock.advance(float(op[1]))  # type: ignore[arg-type]
                elif name == "list":
                    await cluster.list()
                elif name == "resubmit":  # the manual clock stands still: waiting could not help
                    await cluster.resubmit(str(op[1]), wait=0)
                else:
                    await getattr(cluster, str(name))(str(op[1]))
            except EXPECTED:
                pass
            except Exception as exc:  # NotFoundError for a job not submitted yet is fine too
                assert type(exc).__name__ == "NotFoundError", repr(exc)
            await check(cluster, backend, revisions)


async def check(cluster: Cluster, backend: MemoryBackend, revisions: dict[str, int]) -> None:
    records = await cluster.store.list()
    for rec in records:
        # Revisions only go forward.
        assert rec.revision >= revisions.get(rec.job_id, 0)
        revisions[rec.job_id] = rec.revision
        # Every terminal record has a typed cause; cancelled goes with cancelled.
        if rec.outcome.terminal and rec.state is not State.SUCCEEDED:
            assert rec.outcome.cause is not Cause.NONE
        assert (rec.state is State.CANCELLED) == (
            rec.outcome.cause is Cause.CANCELLED and rec.outcome.terminal
        )
        # N counts the user's (re)submissions here (no supervisor, no requeues).
        history = await cluster.history(rec.job_id)
        starts = [t for t in history if t.what in ("submitted", "resubmitted")]
        assert rec.epoch.n == len(starts) and rec.epoch.r == 0
        # The current handle is the current incarnation's.
        if rec.handle is not None:
            assert rec.handle.identity.epoch.n == rec.epoch.n
    # At most one live incarnation per job on the cluster.
    live = [o.handle.identity.job_id for o in await backend.list() if not o.outcome.terminal]
    assert len(live) == len(set(live))
    # Never two incarnations of one job with compute at once.
    assert backend.overlaps == []


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=1, max_size=25))
def test_operator_sequences_keep_the_invariants(program: list[tuple[object, ...]]) -> None:
    asyncio.run(play(program))
