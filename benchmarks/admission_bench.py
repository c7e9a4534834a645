"""dispatch-admission benchmark (not part of the test suite).

Run: .venv/bin/python benchmarks/admission_bench.py [--jobs 200] [--holds 50]

On kubesim (Kueue with the dispatch-hold check on its ClusterQueue, quota for every job) over real HTTP
on loopback, with the controller in-process:
- time for N queued TrainJobs (created at once) to all get their check ``Ready`` (the controller's
  steady-state cost per Workload), and the writes it needed;
- latency from a hold annotation written on one TrainJob to the check's ``Retry`` on its Workload
  (median and p95 over K holds, one at a time);
- time for a standby replica to take over after the leader is killed (lease 2 s, retry 0.2 s).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dispatch_kubeflow.admission import AdmissionController, LeaseSettings
from dispatch_kubeflow.kube import KubeClient
from dispatch_kubeflow.names import ADMISSION_CONTROLLER, ANNOTATION_HOLD
from kubesim import Simulator
from kubesim.fixtures import add_admission_check
from kubesim.resources import TRAINJOBS, WORKLOADS

CHECK = "dispatch-hold"


def trainjob(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"kueue.x-k8s.io/queue-name": "user-queue"},
        },
        "spec": {
            "runtimeRef": {"name": "torch-distributed"},
            "trainer": {"numNodes": 1, "image": "x", "resourcesPerNode": {"requests": {"cpu": "10m"}}},
        },
    }


def states(sim: Simulator) -> dict[str, str]:
    out = {}
    for wl in sim.store.list(WORKLOADS, "default")[0]:
        owner = (wl["metadata"].get("ownerReferences") or [{}])[0].get("name", "")
        for c in (wl.get("status") or {}).get("admissionChecks") or []:
            if c["name"] == CHECK:
                out[owner] = c["state"]
    return out


async def until(done: Any, patience: float = 120.0) -> float:
    start = time.perf_counter()
    while not done():
        if time.perf_counter() - start > patience:
            raise SystemExit("gave up waiting")
        await asyncio.sleep(0.002)
    return time.perf_counter() - start


async def main(jobs: int, holds: int) -> None:
    quota = {"cpu": "1000", "memory": "4Ti", "nvidia.com/gpu": "16", "pods": str(jobs * 4)}
    async with Simulator(nodes=8) as sim:
        from kubesim.fixtures import kueue_objects

        for rt, obj in kueue_objects(nominal=quota):
            if rt.plural == "clusterqueues":
                current = sim.store.get(rt, None, "cluster-queue")
                current["spec"] = obj["spec"]
                sim.store.replace(rt, current)
        add_admission_check(sim.store, CHECK, ADMISSION_CONTROLLER)
        kc = str(sim.write_kubeconfig(Path(tempfile.mkdtemp()) / "kc"))
        client = KubeClient.connect(kubeconfig=kc)
        lease = LeaseSettings(
            namespace="default", identity="bench", duration=2, renew_deadline=1.5, retry_period=0.2
        )
        ctl = AdmissionController(client, lease=lease)
        task = asyncio.create_task(ctl.run())
        await until(ctl.idle)

        start = time.perf_counter()
        for i in range(jobs):
            sim.store.create(TRAINJOBS, trainjob(f"b{i}"))
        await sim.settle()
        reserved = 0.0  # when kubesim's Kueue had reserved quota for all (every Workload lists the check)
        while True:
            s = states(sim)
            if not reserved and len(s) == jobs:
                reserved = time.perf_counter() - start
            if len(s) == jobs and all(v == "Ready" for v in s.values()):
                break
            await sim.settle()
            await asyncio.sleep(0.005)
        took = time.perf_counter() - start
        print(
            f"{jobs} queued TrainJobs -> every check Ready: {took:.2f} s ({took / jobs * 1000:.1f} ms per job; "
            f"kubesim had reserved quota for all after {reserved:.2f} s), "
            f"{ctl.stats['writes']} writes, {ctl.stats['conflicts']} conflicts"
        )

        latencies = []
        for i in range(holds):
            name = f"b{i}"
            tj = sim.store.get(TRAINJOBS, "default", name)
            tj["metadata"].setdefault("annotations", {})[ANNOTATION_HOLD] = f"h-{i}"
            t0 = time.perf_counter()
            sim.store.replace(TRAINJOBS, tj)
            await until(lambda n=name: states(sim).get(n) in ("Retry", "Pending"))
            latencies.append(time.perf_counter() - t0)
            await sim.settle()
        latencies.sort()
        p95 = latencies[max(0, int(len(latencies) * 0.95) - 1)]
        print(
            f"hold annotation -> check Retry/Pending: median {statistics.median(latencies) * 1000:.1f} ms, "
            f"p95 {p95 * 1000:.1f} ms over {holds} holds ({jobs} Workloads cached)"
        )

        standby = AdmissionController(
            KubeClient.connect(kubeconfig=kc),
            lease=LeaseSettings(
                namespace="default", identity="standby", duration=2, renew_deadline=1.5, retry_period=0.2
            ),
        )
        standby_task = asyncio.create_task(standby.run())
        await asyncio.sleep(0.5)
        task.cancel()  # killed: no release
        await asyncio.gather(task, return_exceptions=True)
        took = await until(lambda: standby.leading)
        print(f"takeover after the leader was killed: {took:.2f} s (lease 2 s, retry period 0.2 s)")
        await standby.stop()
        await standby_task
        await client.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=200)
    p.add_argument("--holds", type=int, default=50)
    a = p.parse_args()
    asyncio.run(main(a.jobs, a.holds))
    sys.exit(0)
