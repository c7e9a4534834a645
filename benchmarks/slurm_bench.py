"""Slurm commands per job, and the time to see every job end: dispatch beside submitit, same cluster.

Run: .venv/bin/python benchmarks/slurm_bench.py [--jobs 50 200] [--seconds 2] [--poll 30s] [--environment clean]
(``--poll`` is dispatch's ``pollInterval``: 30s unless given; the adapter's default is 5s.)
(submitit comes with the ``bench`` extra; without it only dispatch is measured.)

One local Slurm with accounting (MariaDB + slurmdbd, so submitit's watcher can read states with
``sacct``) serves both sides, one after the other, for each job count. Every command either side runs
goes through a shim directory put first on ``PATH`` that logs the command's name and then runs the real
one, so both are counted the same way; a *Slurm command* is one of ``sbatch squeue sacct scontrol
scancel`` (each an RPC to slurmctld or slurmdbd), the rest (``sh``, ``cat``...) are counted apart. Each
job sleeps ``--seconds`` and exits 0.

- dispatch, through its public API as a user script would use it: ``dispatch.open("slurm", ...)``
  (opening included in the count), ``Cluster.submit`` for each job, then one ``Cluster.watch()`` for all
  of them until every record is terminal. Opening is counted both ways: *cold* (nothing kept: it reads the
  cluster) and *warm* (within ten minutes of an earlier open that kept the cluster's facts in the host's
  probe cache — the CLI's store, or ``Config(probe_cache=...)`` — as a script run again or any CLI command
  after the first finds them). The run itself opens warm, after one cold open that is counted apart.
- submitit: ``AutoExecutor(cluster="slurm")``, N ``submit`` calls (one ``sbatch`` each), then
  ``job.result()`` for each (its watcher polls ``sacct`` for all its jobs at once, and reads each job's
  result file).

The time is from the first submit to the moment the last job's end is seen.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

import dispatch  # noqa: E402
from dispatch import Config, JobSpec, MemoryProbeCache, MemoryStore  # noqa: E402
from dispatch_slurm.localslurm import LocalSlurm  # noqa: E402
from dispatch_slurm.settings import DEFAULT_POLL  # noqa: E402

SLURM = ("sbatch", "squeue", "sacct", "scontrol", "scancel")
OTHERS = ("sh", "mkdir", "cat", "tail", "touch", "test")


def make_shims(directory: Path, log: Path) -> None:
    """A script per command that logs its name, then runs the real one (by its path: the PATH a shim
    passes on keeps the shims first, so a command an ``sh -c`` runs is counted too)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in (*SLURM, *OTHERS):
        real = shutil.which(name)
        if real is None:
            raise SystemExit(f"{name} is not installed")
        shim = directory / name
        shim.write_text(f'#!/bin/sh\necho {name} >> "{log}"\nexec {real} "$@"\n')
        shim.chmod(0o755)


def counted(log: Path) -> collections.Counter[str]:
    return collections.Counter(log.read_text().split()) if log.exists() else collections.Counter()


async def bench_dispatch(
    slurm: LocalSlurm, jobs: int, seconds: float, poll: str | None, environment: str | None, log: Path
) -> dict[str, Any]:
    raw: dict[str, Any] = {"slurmConf": str(slurm.conf), "workdir": str(slurm.workdir / "dispatch")}
    if poll is not None:
        raw["pollInterval"] = poll
    if environment is not None:
        raw["environment"] = environment
    spec = JobSpec(command=("sleep", f"{seconds:g}"))
    cache = MemoryProbeCache()
    before = counted(log)
    async with await dispatch.open("slurm", Config(adapter=raw, store=MemoryStore(), probe_cache=cache)):
        cold = dict(counted(log) - before)
    start = counted(log)
    cluster = await dispatch.open("slurm", Config(adapter=raw, store=MemoryStore(), probe_cache=cache))
    opened = counted(log)
    async with cluster:
        t0, began = time.monotonic(), time.time()
        ids = [(await cluster.submit(spec)).job_id for _ in range(jobs)]
        submitting = time.monotonic() - t0
        submitted = counted(log)
        ended: dict[str, str] = {}
        async with asyncio.timeout(1800):
            async for rec in cluster.watch():
                if rec.outcome.terminal and rec.job_id in ids:
                    ended[rec.job_id] = rec.state.value
                    if len(ended) == jobs:
                        break
        wall, seen = time.monotonic() - t0, time.time()
        backend = cluster.backend
        polls = (getattr(backend, "polls", 0), getattr(backend, "early_polls", 0))
    done = counted(log)
    first, last = slurm_times(slurm, began, "d-")
    return {
        "cold_opening": cold,
        "phases": {
            "opening (warm)": dict(opened - start),
            "submits": dict(submitted - opened),
            "watch": dict(done - submitted),
        },
        "commands": dict(done - start),
        "wall_s": round(wall, 1),
        "submit_s": round(submitting, 1),
        "first_s": round(first - began, 1),
        "slurm_s": round(last - first, 1),
        "late_s": round(seen - last, 1),
        "states": dict(collections.Counter(ended.values())),
        "polls": polls,
    }


def bench_submitit(slurm: LocalSlurm, jobs: int, seconds: float, log: Path) -> dict[str, Any] | None:
    try:
        import submitit
    except ImportError:
        return None
    start = counted(log)
    t0, began = time.monotonic(), time.time()
    executor = submitit.AutoExecutor(folder=str(slurm.workdir / "submitit" / "%j"), cluster="slurm")
    executor.update_parameters(timeout_min=10, slurm_partition="batch", mem_gb=0.2)
    futures = [executor.submit(time.sleep, seconds) for _ in range(jobs)]
    submitting = time.monotonic() - t0
    for job in futures:
        job.result()
    wall, seen = time.monotonic() - t0, time.time()
    commands = dict(counted(log) - start)
    first, last = slurm_times(slurm, began, "submitit")
    states = collections.Counter(job.state for job in futures)
    return {
        "commands": commands,
        "wall_s": round(wall, 1),
        "submit_s": round(submitting, 1),
        "first_s": round(first - began, 1),
        "slurm_s": round(last - first, 1),
        "late_s": round(seen - last, 1),
        "states": dict(states),
    }


def slurm_times(slurm: LocalSlurm, since: float, prefix: str) -> tuple[float, float]:
    """(first start, last end) that accounting keeps for the jobs named ``prefix``* submitted since
    ``since`` (epoch seconds), read outside the shims (not counted). submitit takes a job for done once
    its result file is written, before Slurm has ended it: this waits until accounting has every end."""
    env = {**slurm.env(), "SLURM_TIME_FORMAT": "%s", "PATH": os.defpath}
    argv = ["sacct", "-X", "-P", "-n", "-S", time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(since - 5)),
            "-o", "jobname,start,end"]  # fmt: skip
    for _ in range(600):
        rows = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.splitlines()
        spans = [r.split("|")[1:3] for r in rows if r.startswith(prefix)]
        if spans and all(a.isdigit() and b.isdigit() for a, b in spans):
            return min(float(a) for a, _ in spans), max(float(b) for _, b in spans)
        time.sleep(0.1)
    raise RuntimeError(f"accounting never showed every end of {prefix}* jobs")


def per_job(commands: dict[str, int], jobs: int) -> str:
    slurm = sum(v for k, v in commands.items() if k in SLURM)
    other = sum(v for k, v in commands.items() if k not in SLURM)
    detail = ", ".join(f"{k} {v}" for k, v in sorted(commands.items()))
    return f"{slurm / jobs:.3f} Slurm commands per job ({slurm}; {other} others) [{detail}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, nargs="+", default=[50])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument(
        "--poll",
        default="30s",
        help="dispatch's pollInterval (default 30s, as a site that asks scripts to poll seldom)",
    )
    parser.add_argument(
        "--environment",
        choices=("login", "clean"),
        default=None,
        help="dispatch's environment (default: the adapter's)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="slurm-bench-") as tmp:
        root = Path(tmp)
        log = root / "commands.log"
        make_shims(root / "shims", log)
        os.environ["PATH"] = f"{root / 'shims'}:{os.environ['PATH']}"
        slurm = LocalSlurm(root / "cluster", accounting=True)
        slurm.start()
        os.environ["SLURM_CONF"] = str(slurm.conf)
        results = []
        try:
            for jobs in args.jobs:
                mine = asyncio.run(
                    bench_dispatch(slurm, jobs, args.seconds, args.poll, args.environment, log)
                )
                theirs = bench_submitit(slurm, jobs, args.seconds, log)
                results.append((jobs, mine, theirs))
        finally:
            slurm.stop()
    for jobs, mine, theirs in results:
        print(f"{jobs} jobs of {args.seconds:g} s on a local Slurm (3 nodes x 4 CPUs, accounting on):")
        poll = args.poll or f"{DEFAULT_POLL.text}, the adapter's default"
        poll += f"; environment {args.environment or 'login, the default'}"
        cold = collections.Counter(mine["commands"]) - collections.Counter(mine["phases"]["opening (warm)"])
        cold.update(mine["cold_opening"])
        print(
            f"  dispatch (public API, pollInterval {poll}), opening warm: {per_job(mine['commands'], jobs)}"
        )
        print(f"    opening cold instead: {per_job(dict(cold), jobs)}")
        print(
            f"    {mine['wall_s']} s to see every job end ({mine['submit_s']} s submitting, the first start "
            f"{mine['first_s']} s after the first submit; Slurm ran them from "
            f"first start to last end in {mine['slurm_s']} s; the last end seen {mine['late_s']} s after it); "
            f"{mine['states']}"
        )
        print(f"    polls: {mine['polls'][0]}, of which {mine['polls'][1]} brought forward by the end marker")
        print(f"    opening cold: {dict(sorted(mine['cold_opening'].items()))}")
        for phase, commands in mine["phases"].items():
            print(f"    {phase}: {dict(sorted(commands.items()))}")
        if theirs is None:
            print("  submitit: not installed (pip install -e '.[bench]')")
        else:
            print(f"  submitit: {per_job(theirs['commands'], jobs)}")
            print(
                f"    {theirs['wall_s']} s to see every job end ({theirs['submit_s']} s submitting, the first start "
                f"{theirs['first_s']} s after the first submit; Slurm ran them "
                f"from first start to last end in {theirs['slurm_s']} s; the "
                f"last end seen {theirs['late_s']} s after it); {theirs['states']}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
