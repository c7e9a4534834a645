"""The supervisor: event→record latency, memory per supervised job, and the simulation's speed.

Run: ``.venv/bin/python benchmarks/supervisor_bench.py [--jobs 1000 10000] [--events 200] [--seeds 10000]
[--kubeflow-seeds 100]`` from the repository root.

- **latency**: N jobs running on the ``memory`` adapter (system clock, a ``MemoryStore``), all leased by
  one supervisor running its loop (``Supervisor.run``, watch mode, default poll 2 s and lease 30 s). Then
  one job at a time is made to end on the cluster (``inject(exit 0)``) and the time until its record
  says ``succeeded`` is measured: p50, p99, max over ``--events`` events.
- **memory per job**: ``tracemalloc`` growth from before the supervisor exists to after it has leased
  and folded every job (so it counts what the supervisor keeps per job, plus the lease now stored in each
  record), divided by N.
- **simulation**: wall time of ``python -m dispatch.simulate`` for ``--seeds`` seeds (in-process,
  sequentially); with ``--seeds-budget S`` it stops after S seconds and extrapolates, saying so. Then
  ``--kubeflow-seeds`` seeds on the Kubeflow harness (``--adapter kubeflow``: kubesim over HTTP; the
  harness module is loaded from tests/kubeflow, so run from the repository root).

Not part of the test suite (speed is measured here, never asserted in tests).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
import tracemalloc

from dispatch.cluster import Cluster
from dispatch.memory import MemoryBackend, MemorySettings
from dispatch.model import JobSpec, State
from dispatch.records import MemoryStore
from dispatch.simulate import load_harness, run_seed

HANG = JobSpec(command=("train",), env={"KUBESIM_SCRIPT": "hang"})


async def _setup(jobs: int) -> tuple[Cluster, MemoryBackend]:
    backend = MemoryBackend(
        MemorySettings(nodes=jobs, start_delay=0.0, cessation_delay=0.0, watch_history=4 * jobs)
    )
    cluster = Cluster(backend, MemoryStore())
    for i in range(jobs):
        await cluster.submit(HANG, job_id=f"job-{i}")
    return cluster, backend


async def latency(jobs: int, events: int, spacing: float) -> None:
    cluster, backend = await _setup(jobs)
    sup = cluster.supervisor()
    stop = asyncio.Event()
    loop = asyncio.create_task(sup.run(stop=stop))
    t0 = time.perf_counter()
    while len(sup.leased) < jobs:  # noqa: ASYNC110 - polling is the measurement; the first steps lease every job
        await asyncio.sleep(0.01)
    warm = time.perf_counter() - t0
    samples: list[float] = []
    step = max(1, jobs // events)
    for k in range(events):
        jid = f"job-{k * step}"
        rec = await cluster.store.get(jid)
        assert rec.handle is not None
        start = time.perf_counter()
        await backend.inject(rec.handle, "exit 0")
        while (await cluster.store.get(jid)).state is not State.SUCCEEDED:  # noqa: ASYNC110 - the measurement
            await asyncio.sleep(0)
        samples.append(time.perf_counter() - start)
        # Events one at a time, spread over more than one poll interval (2 s), so that some of them
        # arrive while the supervisor is scanning every record: the p99 includes that wait.
        await asyncio.sleep(spacing)
    stop.set()
    await loop
    scan = await _scan_time(cluster)
    await cluster.close()  # its feed's task ends with it, not pending when the loop closes
    samples.sort()
    p50 = statistics.median(samples) * 1e3
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1e3
    print(
        f"  {jobs:>6} jobs: event->record p50 {p50:7.2f} ms  p99 {p99:7.2f} ms  max {samples[-1] * 1e3:7.2f} ms"
        f"  (n={len(samples)}; leasing all took {warm:.1f} s; one full scan of every record {scan * 1e3:.0f} ms)"
    )


async def _scan_time(cluster: Cluster) -> float:
    """How long one step takes when it scans every record (every ``poll`` seconds; leases are live)."""
    sup = cluster.supervisor(poll=0.0)  # every step scans
    jobs = len(await cluster.store.list(states=[s for s in State if s is not State.SUCCEEDED]))
    while len(sup.leased) < jobs:  # lease every record (released when the measured supervisor stopped),
        await sup.step()  # a page of claimable ones per scan
    start = time.perf_counter()
    await sup.step()
    took = time.perf_counter() - start
    await sup.close()
    return took


async def memory(jobs: int) -> None:
    cluster, _ = await _setup(jobs)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    sup = cluster.supervisor(poll=0.0)  # every step scans: a page of claimable records each
    await sup.step()
    while len(sup.leased) < jobs:
        await sup.step()
    await sup.step()
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    grown = sum(s.size_diff for s in after.compare_to(before, "filename"))
    leased = len(sup.leased)
    await sup.close()
    await cluster.close()  # its feed's task ends with it, not pending when the loop closes
    print(
        f"  {jobs:>6} jobs: supervisor memory {grown / jobs / 1024:6.2f} KB per job ({grown / 2**20:.1f} MiB, leased {leased})"
    )


async def simulate(seeds: int, budget: float | None, adapter: str = "memory") -> None:
    harness = load_harness(adapter)
    start = time.perf_counter()
    done = violations = 0
    for seed in range(seeds):
        violations += len((await run_seed(seed, harness)).violations)
        done += 1
        if budget is not None and time.perf_counter() - start > budget:
            break
    took = time.perf_counter() - start
    if done < seeds:
        print(
            f"  {done} seeds in {took:.1f} s ({took / done * 1e3:.1f} ms/seed), {violations} violations; "
            f"{seeds} seeds extrapolated: {took / done * seeds:.0f} s"
        )
    else:
        print(f"  {seeds} seeds in {took:.1f} s ({took / seeds * 1e3:.1f} ms/seed), {violations} violations")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, nargs="*", default=[1000, 10000], help="none: skip")
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--spacing", type=float, default=0.02, help="seconds between two measured events")
    parser.add_argument("--seeds", type=int, default=10000)
    parser.add_argument(
        "--seeds-budget", type=float, default=None, help="stop the simulation after S seconds"
    )
    parser.add_argument("--kubeflow-seeds", type=int, default=100)
    args = parser.parse_args()
    if args.jobs:
        print("event -> record latency (memory adapter, one supervisor, watch mode):")
        for n in args.jobs:
            await latency(n, args.events, args.spacing)
        print("supervisor memory:")
        for n in args.jobs:
            await memory(n)
    if args.seeds:
        print("simulation (python -m dispatch.simulate, memory):")
        await simulate(args.seeds, args.seeds_budget)
    if args.kubeflow_seeds:
        print("simulation (python -m dispatch.simulate --adapter kubeflow, kubesim over HTTP):")
        await simulate(args.kubeflow_seeds, args.seeds_budget, "kubeflow")


if __name__ == "__main__":
    asyncio.run(main())
