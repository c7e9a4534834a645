"""API requests and bytes per job lifecycle: dispatch's kubeflow adapter vs the Kubeflow SDK, on one kubesim.

Run: .venv/bin/python benchmarks/kubeflow_bench.py [--jobs 100 1000] [--sdk-jobs 3] [--seconds 20]
(the SDK comes with the ``bench`` extra: ``pip install -e '.[bench]'``; without it only dispatch is measured.)

One kubesim on a real clock serves both, over HTTP on loopback; every request is counted from kubesim's
request log. A *lifecycle* is start → terminal outcome with the failed node's output tail read: each job
prints a few lines, runs ``--seconds`` and exits 1.

- dispatch: one backend (its preflight is not counted), one ``watch()`` for every job, then N jobs placed
  (``prepare`` + ``start``); the outcome of each comes from the watch, and its tail is read into the evidence.
  Also measured: the requests sent while all N jobs run (the steady state: should be none).
- dispatch, per-job watches: N jobs submitted through a ``Cluster``, each followed by its own
  ``cluster.watch(job_id)`` until it ends (they share the backend's one informer).
- SDK (``kubeflow`` 0.5): per job ``TrainerClient.train`` + ``wait_for_job_status({"Failed"})`` (its
  default 2 s polling) + ``get_job_logs``, a few jobs at once in threads (the SDK is synchronous).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dispatch import AdapterConfig, Epoch, Identity, Image, JobSpec, State
from dispatch.backend import place
from dispatch_kubeflow import RuntimeRef
from dispatch_kubeflow.backend import open_backend
from kubesim import Simulator
from kubesim.clock import RealClock
from kubesim.fixtures import runtimes
from kubesim.requestlog import RequestRecord
from kubesim.resources import CLUSTERTRAININGRUNTIMES

SCRIPT = "print step 1; print step 2; sleep {seconds}; print giving up; exit 1"


def window(sim: Simulator, start: int) -> list[RequestRecord]:
    """The requests answered since request number ``start``."""
    n = sim.requests.total - start
    return list(sim.requests)[-n:] if n > 0 else []


def figures(records: list[RequestRecord], jobs: int) -> dict[str, Any]:
    sent = sum(r.request_bytes for r in records)
    received = sum(r.response_bytes for r in records)
    streams = sum(1 for r in records if r.verb == "watch" or r.query_dict().get("follow") == "true")
    by_verb: dict[str, int] = {}
    bytes_by: dict[str, int] = {}
    for r in records:
        key = f"{r.verb} {r.resource}".strip()
        by_verb[key] = by_verb.get(key, 0) + 1
        bytes_by[key] = bytes_by.get(key, 0) + r.request_bytes + r.response_bytes
    return {
        "jobs": jobs,
        "requests": len(records),
        "requests_per_job": len(records) / jobs,
        "streams": streams,
        "bytes_per_job": (sent + received) / jobs,
        "by_verb": dict(sorted(by_verb.items(), key=lambda kv: -kv[1])),
        "kb_per_job_by_verb": {
            k: round(v / jobs / 1000, 1) for k, v in sorted(bytes_by.items(), key=lambda kv: -kv[1])
        },
    }


async def bench_dispatch(sim: Simulator, kc: str, jobs: int, seconds: int) -> dict[str, Any]:
    settings = {"kubeconfig": kc, "outputTailLines": 20}
    backend = await open_backend(AdapterConfig("kubeflow", json.dumps(settings).encode()), probe_window=0.5)
    spec = JobSpec(
        command=("python", "train.py"),
        env={"KUBESIM_SCRIPT": SCRIPT.format(seconds=seconds)},
        extensions=[Image("example.org/train:1"), RuntimeRef("torch-distributed")],
    )
    start = sim.requests.total
    prefix = f"bench-{jobs}-"
    last: dict[str, Any] = {}
    stream = backend.watch()

    changed = asyncio.Event()

    async def consume() -> None:
        async for change in stream:
            if change.handle.identity.job_id.startswith(prefix):
                last[change.handle.identity.job_id] = change.observation
                changed.set()

    async def until(done: Any) -> None:
        while not done():
            changed.clear()
            await changed.wait()

    watcher = asyncio.ensure_future(consume())
    t0 = time.perf_counter()
    sem = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        async with sem:
            await place(backend, spec, Identity(f"{prefix}{i}", Epoch()))

    await asyncio.gather(*(one(i) for i in range(jobs)))
    placed = time.perf_counter() - t0

    def count(state: State | None = None, terminal: bool = False) -> int:
        return sum(
            1
            for o in last.values()
            if (terminal and o.outcome.terminal) or (state is not None and o.state is state)
        )

    await until(lambda: count(State.RUNNING) + count(terminal=True) >= jobs)
    all_running = count(State.RUNNING) == jobs
    steady_start = sim.requests.total
    await asyncio.sleep(min(5.0, seconds / 2))
    steady = window(sim, steady_start)
    await until(lambda: count(terminal=True) >= jobs)
    elapsed = time.perf_counter() - t0
    records = window(sim, start)
    watcher.cancel()
    try:
        await watcher
    except asyncio.CancelledError:
        pass
    await stream.aclose()  # type: ignore[attr-defined]
    await backend.close()
    with_tail = sum(1 for o in last.values() if any(e.output for e in o.outcome.evidence))
    out = figures(records, jobs)
    out.update(
        placed_s=round(placed, 1),
        elapsed_s=round(elapsed, 1),
        steady_requests=len(steady)
        if all_running
        else "not measured: jobs ended before all ran (raise --seconds)",
        with_tail=with_tail,
        causes=sorted({str(o.outcome) for o in last.values()}),
    )
    return out


async def bench_per_job_watch(sim: Simulator, kc: str, jobs: int, seconds: int) -> dict[str, Any]:
    """Every job submitted through a ``Cluster`` and followed by its own ``cluster.watch(job_id)`` until it
    ends, all at once: the watches share the backend's one informer (SPEC §9.6 "One reading path")."""
    import dispatch

    settings = {"kubeconfig": kc, "outputTailLines": 20}
    backend = await open_backend(AdapterConfig("kubeflow", json.dumps(settings).encode()), probe_window=0.5)
    cluster = dispatch.Cluster(backend, dispatch.MemoryStore())
    spec = JobSpec(
        command=("python", "train.py"),
        env={"KUBESIM_SCRIPT": SCRIPT.format(seconds=seconds)},
        extensions=[Image("example.org/train:1"), RuntimeRef("torch-distributed")],
    )
    start = sim.requests.total
    t0 = time.perf_counter()
    last: dict[str, Any] = {}
    sem = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        async with sem:
            rec = await cluster.submit(spec, job_id=f"watched-{jobs}-{i}")
        async for r in cluster.watch(rec.job_id):
            last[r.job_id] = r

    await asyncio.gather(*(one(i) for i in range(jobs)))
    elapsed = time.perf_counter() - t0
    records = window(sim, start)
    await cluster.close()
    out = figures(records, jobs)
    out.update(
        elapsed_s=round(elapsed, 1),
        with_tail=sum(1 for r in last.values() if any(e.output for e in r.outcome.evidence)),
        causes=sorted({str(r.outcome) for r in last.values()}),
    )
    return out


def sdk_jobs(kc: str, jobs: int, seconds: int) -> tuple[list[str], int]:
    """Run the SDK's lifecycle for ``jobs`` jobs in threads; returns the lines read per job and how many
    requests the client's construction took (not counted per job)."""
    from concurrent.futures import ThreadPoolExecutor

    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import CustomTrainerContainer, TrainerClient

    client = TrainerClient(backend_config=KubernetesBackendConfig(namespace="default", config_file=kc))

    def lifecycle(i: int) -> str:
        name = client.train(
            runtime="torch-distributed",
            trainer=CustomTrainerContainer(
                image="example.org/train:1",
                num_nodes=1,
                env={"KUBESIM_SCRIPT": SCRIPT.format(seconds=seconds)},
            ),
        )
        client.wait_for_job_status(name, status={"Failed"}, timeout=seconds * 10, polling_interval=2)
        return "\n".join(client.get_job_logs(name))

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(lifecycle, range(jobs))), 0


async def bench_sdk(sim: Simulator, kc: str, jobs: int, seconds: int) -> dict[str, Any] | str:
    try:
        import kubeflow.trainer  # noqa: F401
    except ImportError as exc:
        return (
            f"the Kubeflow SDK is not installed ({exc}); install the bench extra: pip install -e '.[bench]'"
        )
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient

    before = sim.requests.total
    await asyncio.to_thread(
        TrainerClient, backend_config=KubernetesBackendConfig(namespace="default", config_file=kc)
    )
    construct = sim.requests.total - before
    start = sim.requests.total
    t0 = time.perf_counter()
    try:
        logs, _ = await asyncio.to_thread(sdk_jobs, kc, jobs, seconds)
    except Exception as exc:  # say exactly why, and keep dispatch's figures
        return f"the SDK could not complete a lifecycle on kubesim: {type(exc).__name__}: {exc}"
    records = [
        r
        for r in window(sim, start)
        if r.path != "/api/v1/namespaces/kubeflow-system/configmaps/kubeflow-trainer-public"
    ]
    out = figures(records, jobs)
    out.update(
        elapsed_s=round(time.perf_counter() - t0, 1),
        construct_requests=construct,
        log_lines=[len(x.splitlines()) for x in logs],
    )
    return out


def clear(sim: Simulator) -> None:
    """Remove every TrainJob (and with it, by garbage collection, its JobSet, Jobs and pods) between
    phases, straight in the store: a later phase's watch must not start with the earlier jobs."""
    from kubesim.resources import TRAINJOBS

    for tj in sim.store.list(TRAINJOBS, "default")[0]:
        sim.store.delete(TRAINJOBS, "default", tj["metadata"]["name"], propagation="Background")


def show(title: str, f: dict[str, Any]) -> None:
    print(f"\n{title}")
    for key in (
        "jobs",
        "requests",
        "requests_per_job",
        "streams",
        "bytes_per_job",
        "steady_requests",
        "with_tail",
        "placed_s",
        "elapsed_s",
        "construct_requests",
        "log_lines",
        "causes",
    ):
        if key in f:
            v = f[key]
            print(f"  {key:18} {v:.2f}" if isinstance(v, float) else f"  {key:18} {v}")
    top = list(f["by_verb"].items())[:8]
    print("  by verb/resource   " + ", ".join(f"{k}: {v}" for k, v in top))
    heavy = list(f["kb_per_job_by_verb"].items())[:8]
    print("  KB/job by verb     " + ", ".join(f"{k}: {v}" for k, v in heavy))


async def main() -> int:
    import logging

    logging.getLogger("kubeflow").setLevel(logging.ERROR)  # its "no version ConfigMap" warning on kubesim
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--sdk-jobs", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=20, help="how long each job runs before it fails")
    args = ap.parse_args()
    results: dict[str, Any] = {}
    biggest = max(args.jobs)
    async with Simulator(clock=RealClock(), nodes=max(4, biggest // 100 + 2), install_runtimes=False) as sim:
        for rt in runtimes():  # the stock runtimes, made not to restart: a failed node fails the job at once
            if rt["metadata"]["name"] == "torch-distributed":
                job = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
                job["backoffLimit"] = 0
                job["template"]["spec"]["restartPolicy"] = "Never"
                sim.store.create(CLUSTERTRAININGRUNTIMES, rt)
        with tempfile.TemporaryDirectory() as d:
            kc = str(sim.write_kubeconfig(Path(d) / "kubeconfig"))
            for n in args.jobs:
                # long enough for every job to be running at once (placing 1,000 takes tens of seconds)
                seconds = args.seconds if n <= 100 else args.seconds + n // 10
                results[f"dispatch-{n}"] = await bench_dispatch(sim, kc, n, seconds)
                results[f"dispatch-{n}"]["job_seconds"] = seconds
                clear(sim)
                show(f"dispatch kubeflow adapter, {n} jobs (one watch for all)", results[f"dispatch-{n}"])
                results[f"watch-{n}"] = await bench_per_job_watch(sim, kc, n, seconds)
                clear(sim)
                show(
                    f"dispatch Cluster, {n} jobs, each followed by its own cluster.watch(job_id)",
                    results[f"watch-{n}"],
                )
            sdk = await bench_sdk(sim, kc, args.sdk_jobs, args.seconds)
            if isinstance(sdk, str):
                print(f"\nKubeflow SDK: not measured: {sdk}")
            else:
                results["sdk"] = sdk
                show(
                    f"Kubeflow SDK 0.5 TrainerClient, {args.sdk_jobs} jobs (train + wait_for_job_status + get_job_logs)",
                    sdk,
                )
                print("\nratios (SDK / dispatch), per job lifecycle:")
                for n in args.jobs:
                    for what in ("dispatch", "watch"):
                        d = results[f"{what}-{n}"]
                        print(
                            f"  vs {what} at {n:5} jobs: requests {sdk['requests_per_job'] / d['requests_per_job']:.1f}x, "
                            f"bytes {sdk['bytes_per_job'] / d['bytes_per_job']:.1f}x"
                        )
    print("\n" + json.dumps(results, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
