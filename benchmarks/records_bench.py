"""Records store throughput: creates/s, CAS updates/s, gets/s and lists for each store.

Run: ``.venv/bin/python benchmarks/records_bench.py [--jobs N] [--updates N] [--dir DIR]``.
Numbers depend on the disk (SQLite fsyncs every commit: ``synchronous=FULL``); run it where the store
will live. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from dispatch import Actor, JobRecord, JobSpec, State, Store, Transition
from dispatch.records import MemoryStore, SqliteStore


def _record(job_id: str, now: float) -> JobRecord:
    return JobRecord(
        job_id=job_id,
        spec=JobSpec(command=("python", "train.py", "--epochs", "10"), nodes=2, env={"SEED": "1"}),
        created_at=now,
        updated_at=now,
    )


async def _timed(label: str, n: int, fn: Callable[[int], Awaitable[object]]) -> None:
    start = time.perf_counter()
    for i in range(n):
        await fn(i)
    elapsed = time.perf_counter() - start
    print(f"  {label:<28} {n / elapsed:>10.0f}/s   ({elapsed * 1e3 / n:.3f} ms each, n={n})")


async def bench(name: str, store: Store, jobs: int, updates: int) -> None:
    print(f"{name}:")
    now = time.time()
    first = Transition(at=now, actor=Actor.USER, what="submitted")
    await _timed("create", jobs, lambda i: store.create(_record(f"job-{i}", now), first))

    rec = await store.get("job-0")
    step = Transition(at=now, actor=Actor.SUPERVISOR, what="observed", state=State.RUNNING)

    async def update(i: int) -> None:
        nonlocal rec
        rec = await store.update(
            rec.replace(hold_requested=not rec.hold_requested),
            expected_revision=rec.revision,
            transitions=[step],
        )

    await _timed("CAS update (+1 transition)", updates, update)
    await _timed("get", updates, lambda i: store.get(f"job-{i % jobs}"))
    await _timed(
        "lease acquire/renew", updates, lambda i: store.acquire_lease(f"job-{i % jobs}", "bench", 60)
    )
    await _timed(f"list ({jobs} records)", 10, lambda i: store.list())

    # Two concurrent writers on the same record: how fast CAS makes progress under contention.
    await store.create(_record("contended", now), first)
    done = 0

    async def writer(n: int) -> None:
        nonlocal done
        while n:
            cur = await store.get("contended")
            try:
                await store.update(cur, expected_revision=cur.revision)
            except Exception:  # ConflictError: someone else won this revision; read again
                continue
            n -= 1
            done += 1

    start = time.perf_counter()
    await asyncio.gather(writer(updates // 2), writer(updates // 2))
    elapsed = time.perf_counter() - start
    print(f"  {'contended CAS (2 tasks)':<28} {done / elapsed:>10.0f}/s")
    await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--updates", type=int, default=1000)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to put the SQLite file (default: a temp dir)"
    )
    args = parser.parse_args()
    await bench("MemoryStore", MemoryStore(), args.jobs, args.updates)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        await bench(f"SqliteStore ({d})", SqliteStore(Path(d) / "jobs.db"), args.jobs, args.updates)


if __name__ == "__main__":
    asyncio.run(main())
