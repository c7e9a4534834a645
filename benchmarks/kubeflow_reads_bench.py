"""What the kubeflow adapter's reads cost on kubesim (not part of the test suite).

Run: .venv/bin/python benchmarks/kubeflow_reads_bench.py [--jobs 200]

Starts N jobs (two running pods each) on kubesim over real HTTP, then prints, from kubesim's request log:
- requests and bytes of one ``observe`` (TrainJob, JobSet, Jobs, pods, Workload);
- requests and bytes of one ``list`` over all N jobs (one list per kind, whatever N), and per job;
- wall time of each (loopback, one process: relative figures, not a cluster's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "kubeflow"))

from kubeflow_fixtures import STOCK, config, ident, install, kubeconfig, spec

from dispatch_kubeflow.backend import open_backend
from kubesim.sim import Simulator


async def main(jobs: int) -> None:
    async with Simulator(install_runtimes=False, nodes=max(4, jobs // 20)) as sim:
        install(sim, *(make() for make in STOCK.values()))
        with tempfile.TemporaryDirectory() as d:
            kc = kubeconfig(Path(d) / "kc", sim.url, sim.token("admin"))
            backend = await open_backend(config({"kubeconfig": kc, "queue": "user-queue"}), probe_window=0.3)
            try:
                job = spec(nodes=2, env={"KUBESIM_SCRIPT": "hang"})
                handles = [
                    await backend.start(await backend.prepare(job, ident(f"bench-{i}"))) for i in range(jobs)
                ]
                await sim.settle()

                def window() -> tuple[int, int]:
                    return sim.requests.total, sum(sim.requests.bytes_total())

                times, before = [], window()
                for h in handles[:50]:
                    t = time.perf_counter()
                    await backend.observe(h)
                    times.append(time.perf_counter() - t)
                after = window()
                n = min(50, len(handles))
                observe = {
                    "requests": (after[0] - before[0]) / n,
                    "bytes": (after[1] - before[1]) / n,
                    "ms": statistics.median(times) * 1000,
                }
                before = window()
                t = time.perf_counter()
                listed = await backend.list()
                elapsed = time.perf_counter() - t
                after = window()
                states: dict[str, int] = {}
                for o in listed:
                    states[str(o.outcome)] = states.get(str(o.outcome), 0) + 1
                print(
                    json.dumps(
                        {
                            "jobs": jobs,
                            "observe_one": observe,
                            "list_all": {
                                "requests": after[0] - before[0],
                                "bytes": after[1] - before[1],
                                "bytes_per_job": (after[1] - before[1]) / max(1, len(listed)),
                                "ms": elapsed * 1000,
                                "observations": len(listed),
                                "outcomes": states,
                            },
                        },
                        indent=2,
                    )
                )
            finally:
                await backend.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    asyncio.run(main(parser.parse_args().jobs))
