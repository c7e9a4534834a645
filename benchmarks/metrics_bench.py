"""What serving metrics costs the supervisor: event throughput with metrics off and on.

Run: ``.venv/bin/python benchmarks/metrics_bench.py [--jobs 2000] [--rounds 5]``.

N jobs run on the ``memory`` adapter under one supervisor (watch mode). All of them are made to end at
once (``inject(exit 0)``) and the time until every record says ``succeeded`` gives the events folded
and acted on per second. Rounds alternate metrics off and on (``dispatch.metrics.enable`` with an HTTP
endpoint on a free loopback port, scraped once per round), so load on the machine hits both alike; the
figure is the median of each, and the ratio on/off. Goal (issue 15): on/off ≥ 0.95.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import urllib.request

from dispatch import metrics
from dispatch.cluster import Cluster
from dispatch.memory import MemoryBackend, MemorySettings
from dispatch.model import JobSpec, State
from dispatch.records import MemoryStore

HANG = JobSpec(command=("train",), env={"KUBESIM_SCRIPT": "hang"})


def _scrape(port: int | None) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        return bytes(resp.read())


async def one_round(jobs: int, *, with_metrics: bool) -> float:
    if with_metrics:
        metrics.enable("127.0.0.1:0")
    try:
        backend = MemoryBackend(
            MemorySettings(nodes=jobs, start_delay=0.0, cessation_delay=0.0, watch_history=4 * jobs)
        )
        cluster = Cluster(backend, MemoryStore())
        for i in range(jobs):
            await cluster.submit(HANG, job_id=f"job-{i}")
        sup = cluster.supervisor(poll=5.0, lease=60.0, resync=3600.0)
        stop = asyncio.Event()
        loop = asyncio.create_task(sup.run(stop=stop))
        while len(sup.leased) < jobs:  # noqa: ASYNC110 - waiting for the supervisor to lease every job
            await asyncio.sleep(0.01)
        handles = [(await cluster.store.get(f"job-{i}")).handle for i in range(jobs)]
        start = time.perf_counter()
        for h in handles:
            assert h is not None
            await backend.inject(h, "exit 0")
        while True:
            records = await cluster.store.list()
            if all(r.state is State.SUCCEEDED for r in records):
                break
            await asyncio.sleep(0.005)
        took = time.perf_counter() - start
        if with_metrics:
            port = metrics.served_port()
            body = await asyncio.to_thread(_scrape, port)
            assert b"dispatch_outcomes_total" in body
        stop.set()
        await loop
        return jobs / took
    finally:
        metrics.disable()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    off: list[float] = []
    on: list[float] = []
    for _ in range(args.rounds):
        off.append(await one_round(args.jobs, with_metrics=False))
        on.append(await one_round(args.jobs, with_metrics=True))
    m_off, m_on = statistics.median(off), statistics.median(on)
    print(f"supervisor event throughput, {args.jobs} jobs ending at once, {args.rounds} rounds each:")
    print(f"  metrics off: median {m_off:8.0f} events/s  (min {min(off):.0f}, max {max(off):.0f})")
    print(f"  metrics on:  median {m_on:8.0f} events/s  (min {min(on):.0f}, max {max(on):.0f})")
    print(f"  on/off: {m_on / m_off:.3f}  (goal >= 0.95)")


if __name__ == "__main__":
    asyncio.run(main())
