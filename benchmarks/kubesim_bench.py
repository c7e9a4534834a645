"""kubesim API-machinery benchmark (not part of the test suite).

Run: .venv/bin/python benchmarks/kubesim_bench.py [--objects 10000] [--watchers 50] [--events 1000]

Measures, on a bare simulator (no controllers) over real HTTP on loopback:
- creates per second (sequential and with 8 concurrent clients);
- cost per create for the first 1,000 vs the last 1,000 of N creates (the ratio should stay near 1:
  a request's cost must not grow with the number of requests served);
- watch fan-out: W watchers each receiving M events, time until all are delivered;
- memory with N objects in the store (tracemalloc of the store, process RSS);
- the cost of pruning unknown fields from a pod and a ClusterTrainingRuntime body.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import statistics
import sys
import time
import tracemalloc
from typing import Any

import aiohttp

from kubesim import Simulator
from kubesim.resources import CONFIGMAPS

CM = "/api/v1/namespaces/default/configmaps"


def configmap(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "default", "labels": {"bench": "yes", "shard": name[-1]}},
        "data": {"payload": "x" * 200},
    }


async def bench_creates(n: int) -> dict[str, float]:
    async with Simulator(controllers=[], history_limit=10_000) as sim:
        headers = {"Authorization": f"Bearer {sim.token('admin')}", "Content-Type": "application/json"}
        conn = aiohttp.TCPConnector(limit=16)
        async with aiohttp.ClientSession(headers=headers, connector=conn) as s:
            per_request: list[float] = []
            t_all = time.perf_counter()
            for i in range(n):
                body = json.dumps(configmap(f"cm-{i:06d}"))
                t0 = time.perf_counter()
                async with s.post(sim.url + CM, data=body) as r:
                    await r.read()
                    assert r.status == 201, r.status
                per_request.append(time.perf_counter() - t0)
            seq_elapsed = time.perf_counter() - t_all

            async def worker(k: int, count: int) -> None:
                for j in range(count):
                    async with s.post(sim.url + CM, data=json.dumps(configmap(f"par-{k}-{j:05d}"))) as r:
                        await r.read()

            par_n = min(n, 2000)
            t0 = time.perf_counter()
            await asyncio.gather(*(worker(k, par_n // 8) for k in range(8)))
            par_elapsed = time.perf_counter() - t0
            t0 = time.perf_counter()
            async with s.get(sim.url + CM, params={"labelSelector": "shard=7"}) as r:
                items = (await r.json())["items"]
            list_ms = (time.perf_counter() - t0) * 1000
        k = min(1000, n // 2)
        first = statistics.mean(per_request[:k])
        last = statistics.mean(per_request[-k:])
        return {
            "creates": n,
            "creates_per_s_sequential": n / seq_elapsed,
            "creates_per_s_8_clients": (par_n // 8 * 8) / par_elapsed,
            "first_1000_mean_ms": first * 1000,
            "last_1000_mean_ms": last * 1000,
            "last_over_first_ratio": last / first,
            "requests_logged": float(len(sim.requests)),
            "list_with_selector_ms": list_ms,
            "list_matched": float(len(items)),
        }


async def bench_fanout(watchers: int, events: int) -> dict[str, float]:
    async with Simulator(controllers=[], history_limit=max(10_000, events * 2)) as sim:
        headers = {"Authorization": f"Bearer {sim.token('admin')}"}
        conn = aiohttp.TCPConnector(limit=watchers + 4)
        async with aiohttp.ClientSession(headers=headers, connector=conn) as s:
            rv = str(sim.store.resource_version)
            counts = [0] * watchers
            done = asyncio.Event()

            async def watch(idx: int) -> None:
                params = {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "600"}
                async with s.get(sim.url + CM, params=params) as r:
                    async for line in r.content:
                        if line.strip():
                            counts[idx] += 1
                            if counts[idx] >= events:
                                break
                if all(c >= events for c in counts):
                    done.set()

            tasks = [asyncio.create_task(watch(i)) for i in range(watchers)]
            for _ in range(10_000):  # wait until every watch is registered
                if sim.server.active_watches() >= watchers:
                    break
                await asyncio.sleep(0.01)
            t0 = time.perf_counter()
            for i in range(events):
                sim.store.create(CONFIGMAPS, configmap(f"w-{i:06d}"))
                if i % 100 == 99:
                    await asyncio.sleep(0)  # let the server flush
            await asyncio.wait_for(done.wait(), 300)
            elapsed = time.perf_counter() - t0
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return {
            "watchers": watchers,
            "events_each": events,
            "delivered_total": float(sum(counts)),
            "seconds": elapsed,
            "deliveries_per_s": sum(counts) / elapsed,
        }


def bench_memory(n: int) -> dict[str, float]:
    from kubesim.clock import ManualClock
    from kubesim.store import ObjectStore

    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    store = ObjectStore(ManualClock(), history_limit=10_000)
    for i in range(n):
        store.create(CONFIGMAPS, configmap(f"m-{i:06d}"))
    gc.collect()
    after = tracemalloc.take_snapshot()
    size = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    tracemalloc.stop()
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "objects": n,
        "store_bytes_total": float(size),
        "bytes_per_object": size / n,
        "process_max_rss_mb": rss_kb / 1024,
        "objects_in_store": float(store.count(CONFIGMAPS)),
    }


def bench_pruning(rounds: int = 2000) -> dict[str, float]:
    """Cost of dropping unknown fields (every create/update/patch over HTTP pays it once per body)."""
    import copy

    from kubesim.fields import prune_unknown
    from kubesim.fixtures import runtimes
    from kubesim.resources import CLUSTERTRAININGRUNTIMES, PODS

    runtime = runtimes()[0]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "default", "labels": {"a": "b"}},
        "spec": runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
            "spec"
        ],
    }
    out: dict[str, float] = {}
    for label, rt, body in (("pod", PODS, pod), ("clustertrainingruntime", CLUSTERTRAININGRUNTIMES, runtime)):
        copies = [copy.deepcopy(body) for _ in range(rounds)]
        prune_unknown(rt, copy.deepcopy(body))  # build the cached skeleton first
        t0 = time.perf_counter()
        for c in copies:
            prune_unknown(rt, c)
        out[f"{label}_us_per_body"] = (time.perf_counter() - t0) / rounds * 1e6
        out[f"{label}_body_bytes"] = float(len(json.dumps(body)))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--objects", type=int, default=10_000)
    p.add_argument("--watchers", type=int, default=50)
    p.add_argument("--events", type=int, default=1000)
    args = p.parse_args(argv)

    def show(title: str, data: dict[str, float]) -> None:
        print(f"\n== {title}")
        for k, v in data.items():
            print(f"  {k:28s} {v:,.3f}" if isinstance(v, float) else f"  {k:28s} {v}")

    show("creates over HTTP", asyncio.run(bench_creates(args.objects)))
    show("watch fan-out", asyncio.run(bench_fanout(args.watchers, args.events)))
    show("memory (store only, in-process)", bench_memory(args.objects))
    show("unknown-field pruning (in-process)", bench_pruning())
    return 0


if __name__ == "__main__":
    sys.exit(main())
