"""A second process for the shared-store tests: ``python records_child.py MODE WHERE [ARGS...]``.

``WHERE`` is a SQLite file, or a ``postgresql://`` URL for a PostgresStore.

Modes (each prints one line per acknowledged step, flushed, so the parent knows what was promised):
- ``increment N``: N increments of the record ``counter``'s COUNTER, retrying on ConflictError;
  prints ``won REVISION`` after each successful update.
- ``lease HOLDER JOB...``: try to take each job's lease once; prints ``got JOB`` or ``lost JOB``.
- ``hold TTL HOLDER JOB...``: like ``lease`` with a TTL-second lease, then prints ``holding`` and
  waits, holding them, until killed.
- ``burst PREFIX``: create ``PREFIX-K`` records and update them forever; prints ``rev JOB REVISION`` after
  each write returns. Meant to be killed.
Every mode prints ``ready`` once the store is open, then waits for a line on stdin before starting.
"""

from __future__ import annotations

import asyncio
import sys

from records_samples import counter_of, note, simple_record, with_counter

from dispatch import ConflictError, Store
from dispatch.records import SqliteStore


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(mode: str, path: str, args: list[str]) -> None:
    store: Store
    if path.startswith("postgresql://"):
        from dispatch.records import PostgresStore

        store = PostgresStore(path, timeout=60.0)
    else:
        store = SqliteStore(path, busy_timeout=60.0)
    await store.list()  # opens (and creates) the store before we say so
    say("ready")
    await asyncio.to_thread(sys.stdin.readline)
    if mode == "increment":
        for _ in range(int(args[0])):
            while True:
                current = await store.get("counter")
                await asyncio.sleep(0.002)  # widen the window between read and write: races happen
                try:
                    stored = await store.update(
                        with_counter(current, counter_of(current) + 1),
                        expected_revision=current.revision,
                        transitions=[note("increment by child")],
                    )
                except ConflictError:
                    continue
                say(f"won {stored.revision}")
                break
    elif mode in ("lease", "hold"):
        ttl = float(args.pop(0)) if mode == "hold" else 3600.0
        holder, jobs = args[0], args[1:]
        for job in jobs:
            try:
                await store.acquire_lease(job, holder, ttl)
            except ConflictError:
                say(f"lost {job}")
            else:
                say(f"got {job}")
        if mode == "hold":
            say("holding")
            await asyncio.Event().wait()  # until killed: the leases are never released
    elif mode == "burst":
        k = 0
        while True:
            k += 1
            job = f"{args[0]}-{k}"
            rec = await store.create(simple_record(job), note("created"))
            say(f"rev {job} {rec.revision}")
            for i in range(1, 6):
                rec = await store.update(
                    with_counter(rec, i), expected_revision=rec.revision, transitions=[note(f"step {i}")]
                )
                say(f"rev {job} {rec.revision}")
    else:
        raise SystemExit(f"unknown mode {mode!r}")
    await store.close()
    say("done")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
