"""Records store throughput: creates/s, CAS updates/s, gets/s, lists and change-notification latency
for each store (Memory, SQLite, PostgreSQL).

Run: ``.venv/bin/python benchmarks/records_bench.py [--jobs N] [--updates N] [--dir DIR] [--postgres DSN]``.
Numbers depend on the disk (SQLite fsyncs every commit: ``synchronous=FULL``); run it where the store
will live. PostgreSQL: ``--postgres URL`` measures that server (an empty database you can write to);
without it, a throwaway local server is started from the ``postgresql`` package's binaries (the one the
tests use, with fsync off, so its write figures are an upper bound), or skipped when there are none.
``--codec-only`` measures just the model's encode/decode cost per record (no store). Not part of
the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from dispatch import Actor, JobRecord, JobSpec, State, Store, Transition
from dispatch.records import ChangeNotifier, MemoryStore, SqliteStore

_TEST_HELPERS = Path(__file__).resolve().parent.parent / "tests" / "records"  # pgserver.py


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


async def bench(
    name: str, store: Store, jobs: int, updates: int, reopen: Callable[[], Store] | None = None
) -> None:
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
    if isinstance(store, ChangeNotifier):
        await _notification_latency(store, reopen)
    await store.close()


async def _notification_latency(store: Store, reopen: Callable[[], Store] | None, n: int = 50) -> None:
    """From an update's call to a subscriber hearing of it: in-process, and (for a shared store) with
    the write made by another store instance, as another supervisor would."""
    assert isinstance(store, ChangeNotifier)
    writers = [("same store", store)]
    if reopen is not None:
        writers.append(("other store", reopen()))
    for label, writer in writers:
        samples = []
        async with store.changes() as feed:
            for _ in range(n):
                cur = await writer.get("contended")
                start = time.perf_counter()
                await writer.update(cur, expected_revision=cur.revision)
                async for job_id in feed:
                    if job_id == "contended":
                        break
                samples.append(time.perf_counter() - start)
        if writer is not store:
            await writer.close()
        samples.sort()
        print(
            f"  {'notify (' + label + ')':<28} median {statistics.median(samples) * 1e3:.2f} ms, "
            f"p95 {samples[int(len(samples) * 0.95) - 1] * 1e3:.2f} ms (update + delivery, n={n})"
        )


def _full_record(now: float) -> JobRecord:
    """A record with every part a supervised job's record has: policy, handle, outcome with evidence."""
    from dispatch import DEFAULT_POLICY, Cause, Evidence, Extensions, Handle, Identity, Image, Outcome

    spec = JobSpec(
        command=("python", "train.py", "--epochs", "10"),
        nodes=2,
        env={"SEED": "1", "NCCL_DEBUG": "INFO"},
        extensions=Extensions([Image("pytorch/pytorch:2.5")]),
    )
    evidence = Evidence(
        "Pod", "job-1-node-0-0", reason="OOMKilled", exit_code=137, node="n1", at=now, output=("a", "b")
    )
    return JobRecord(
        job_id="job-1",
        spec=spec,
        created_at=now,
        updated_at=now,
        policy=DEFAULT_POLICY,
        handle=Handle("kubeflow", Identity("job-1"), "default/job-1"),
        outcome=Outcome(State.FAILED, Cause.OUT_OF_MEMORY, (evidence,)),
        revision=7,
    )


def bench_codec(n: int) -> None:
    """The model's own cost, without any store: what every store write and read pays per record."""
    from dispatch.model import load_json
    from dispatch.records._common import checked_record, decode_record

    rec = _full_record(time.time())
    doc = rec.to_json()
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    spec_text = json.dumps(doc["spec"])

    def timed(label: str, fn: Callable[[], object]) -> None:
        fn()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        each = (time.perf_counter() - start) / n
        print(f"  {label:<40} {each * 1e6:>8.1f} µs")

    print(f"model codec (one record of {len(text)} bytes of JSON, n={n}):")
    timed("to_json", rec.to_json)
    timed("from_json (already parsed)", lambda: JobRecord.from_json(doc))
    timed("JobSpec.loads (JSON text, strict)", lambda: JobSpec.loads(spec_text))
    timed("load_json + from_json", lambda: JobRecord.from_json(load_json(text)))
    timed("store write check (encode + decode)", lambda: checked_record(rec))
    timed("store read (decode stored text)", lambda: decode_record("job-1", text, "bench"))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--updates", type=int, default=1000)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to put the SQLite file (default: a temp dir)"
    )
    parser.add_argument("--postgres", default=None, help="a PostgreSQL URL (default: a throwaway server)")
    parser.add_argument("--codec-only", action="store_true", help="measure the model codec only")
    args = parser.parse_args()
    bench_codec(5000)
    if args.codec_only:
        return
    await bench("MemoryStore", MemoryStore(), args.jobs, args.updates)
    with tempfile.TemporaryDirectory(dir=args.dir) as d:
        path = Path(d) / "jobs.db"
        await bench(
            f"SqliteStore ({d})", SqliteStore(path), args.jobs, args.updates, lambda: SqliteStore(path)
        )
    await bench_postgres(args)


async def bench_postgres(args: argparse.Namespace) -> None:
    try:
        from dispatch.records import PostgresStore
    except Exception as exc:  # UnsupportedError: psycopg is not installed
        print(f"PostgresStore: skipped ({exc})")
        return
    server = None
    dsn = args.postgres
    if dsn is None:
        sys.path.insert(0, str(_TEST_HELPERS))
        from pgserver import PgServer, find_bin

        bindir = find_bin()
        if bindir is None:
            print("PostgresStore: skipped (no initdb/pg_ctl: apt-get install postgresql, or --postgres URL)")
            return
        server = PgServer.start(bindir)
        dsn = server.dsn(server.new_database())
    try:
        store = PostgresStore(dsn)
        label = f"PostgresStore ({store.where}{', throwaway server, fsync off' if server else ''})"
        await bench(label, store, args.jobs, args.updates, lambda: PostgresStore(dsn))
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    asyncio.run(main())
