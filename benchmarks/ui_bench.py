"""The page's cost: the jobs page at two store sizes, a job page with many incarnations, and how soon a
change reaches an open page (store write -> server-sent event), over real HTTP on loopback.

Run: ``.venv/bin/python benchmarks/ui_bench.py [--jobs 1000,10000] [--incarnations 50] [--rounds 20]``.
The records live in a SQLite store in a temporary directory (the embedded default's store), written
through the host's own record changes; the page is served by ``dispatch.ui.app.serve`` exactly as
``dispatch ui`` serves it. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

from dispatch import decide
from dispatch.cluster import Cluster
from dispatch.memory import MemoryBackend, MemorySettings
from dispatch.model import (
    Action,
    Actor,
    Cause,
    Epoch,
    Handle,
    Identity,
    JobRecord,
    JobSpec,
    Outcome,
    PlanAction,
    Policy,
    Rule,
    State,
    Transition,
)
from dispatch.records import SqliteStore, Store
from dispatch.ui.app import serve

SPEC = JobSpec(command=("python", "train.py"), nodes=2)


async def _fill(store: Store, jobs: int, start: int = 0) -> None:
    for i in range(start, jobs):
        rec, first = decide.submitted(f"job-{i:06d}", SPEC, policy=None, held=False, now=1000.0 + i)
        await store.create(rec, first)


def _state(
    rec: JobRecord, at: float, state: State, cause: Cause = Cause.NONE
) -> tuple[JobRecord, list[Transition]]:
    t = Transition(at=at, actor=Actor.CLUSTER, what=state.value, state=state, cause=cause, epoch=rec.epoch)
    return rec.replace(outcome=Outcome(state, cause)), [t]


async def _many_incarnations(store: Store, job: str, n: int) -> None:
    """A job preempted ``n - 1`` times and requeued each time, then running."""
    policy = Policy({Cause.PREEMPTED: Rule(Action.REQUEUE, max=n + 1, backoff=1.0)})
    at = time.time() - 60.0 * n  # the last incarnation is running now
    rec, first = decide.submitted(job, SPEC, policy=policy, held=False, now=at)
    rec = await store.create(rec, first)
    for i in range(n):
        ident = Identity(job, rec.epoch)
        steps = [
            decide.started(
                rec, Handle("memory", ident, f"{job}-{rec.epoch.n}"), actor=Actor.SUPERVISOR, now=at
            )
        ]
        assert steps[0] is not None
        rec2, ts = steps[0]
        for state in (State.QUEUED, State.RUNNING):
            at += 5
            rec2, more = _state(rec2, at, state)
            ts += more
        if i < n - 1:
            at += 25
            rec2, more = _state(rec2, at, State.FAILED, Cause.PREEMPTED)
            ts += more
            plan = decide.next(rec2, policy, at)
            assert plan.action is PlanAction.REQUEUE, plan
            rec2, more = decide.requeued(rec2, plan, now=at + 1)
            ts += more
        rec = await store.update(rec2, expected_revision=rec.revision, transitions=ts)
        at += 10
    assert rec.epoch == Epoch(n, n - 1)


async def _get_ms(http: aiohttp.ClientSession, url: str, rounds: int) -> tuple[float, int]:
    times = []
    size = 0
    for _ in range(rounds):
        start = time.perf_counter()
        async with http.get(url) as r:
            body = await r.read()
            assert r.status == 200, r.status
        times.append((time.perf_counter() - start) * 1e3)
        size = len(body)
    return statistics.median(times), size


async def _event_latency(
    http: aiohttp.ClientSession, url: str, store: Store, rounds: int, base: int
) -> float:
    lags = []
    async with http.get(url + "events") as stream:
        await stream.content.readline()  # the stream is open
        await asyncio.sleep(0.2)
        for i in range(rounds):
            job = f"live-{base + i}"
            start = time.perf_counter()
            rec, first = decide.submitted(job, SPEC, policy=None, held=False, now=time.time())
            await store.create(rec, first)
            while True:
                line = (await stream.content.readline()).decode()
                if line.strip() == f"data: {job}":
                    break
            lags.append((time.perf_counter() - start) * 1e3)
    return statistics.median(lags)


async def main(sizes: list[int], incarnations: int, rounds: int) -> None:
    print(f"python {sys.version.split()[0]}; SQLite store; median of {rounds} requests each")
    with tempfile.TemporaryDirectory() as tmp:
        store = SqliteStore(Path(tmp) / "jobs.db")
        cluster = Cluster(MemoryBackend(MemorySettings()), store)
        async with cluster, await serve(cluster, "127.0.0.1:0") as server, aiohttp.ClientSession() as http:
            have = 0
            for size in sizes:
                await _fill(store, size, have)
                have = size
                ms, nbytes = await _get_ms(http, server.url, rounds)
                print(f"  jobs page, {size:>6} jobs          {ms:8.1f} ms  {nbytes / 1024:8.0f} KiB")
            await _many_incarnations(store, "many", incarnations)
            ms, nbytes = await _get_ms(http, server.url + "jobs/many", rounds)
            print(f"  job page, {incarnations:>4} incarnations     {ms:8.1f} ms  {nbytes / 1024:8.0f} KiB")
            lag = await _event_latency(http, server.url, store, rounds, have)
            print(f"  store write -> event on an open page  {lag:6.1f} ms (SQLite feed polls every 50 ms)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", default="1000,10000", help="store sizes, comma-separated")
    parser.add_argument("--incarnations", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    asyncio.run(main([int(x) for x in args.jobs.split(",")], args.incarnations, args.rounds))
