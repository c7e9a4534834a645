"""Slurm commands per job lifecycle for N jobs followed at once: dispatch's slurm adapter vs submitit.

Run: .venv/bin/python benchmarks/slurm_bench.py [--jobs 50] [--seconds 2]
(submitit comes with the ``bench`` extra; without it only dispatch is measured.)

One local Slurm with accounting (MariaDB + slurmdbd: submitit polls ``sacct``) serves both, in the same
run. Every Slurm command either side runs goes through a shim directory put first on ``PATH`` that logs
the command's name and then runs the real one, so both are counted the same way. A *lifecycle* is
submit → terminal state known; each job sleeps ``--seconds`` and exits 0.

- dispatch: one backend (its opening reads are counted apart), one ``watch()`` for every job, N jobs
  placed (``prepare`` + ``start``: an ``squeue`` identity lookup, ``mkdir``, ``sbatch``), the outcomes from
  the watch's one ``squeue --json`` per poll interval (``--poll``).
- submitit: ``AutoExecutor(cluster="slurm")``, N ``submit`` calls (one ``sbatch`` each), then
  ``job.result()`` for each (submitit's watcher polls ``sacct`` for all its jobs at once).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from dispatch import JobSpec  # noqa: E402
from dispatch.backend import place  # noqa: E402
from dispatch.model import Identity  # noqa: E402
from dispatch_slurm import open_backend, parse_settings  # noqa: E402
from dispatch_slurm.localslurm import LocalSlurm  # noqa: E402

COMMANDS = ("sbatch", "squeue", "sacct", "scontrol", "scancel", "mkdir", "cat", "tail", "touch", "test", "sh")


def make_shims(directory: Path, log: Path) -> None:
    """A script per command that logs its name, then runs the real one found further down PATH."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in COMMANDS:
        shim = directory / name
        shim.write_text(
            f'#!/bin/sh\necho {name} >> "{log}"\nPATH="${{PATH#{directory}:}}" exec {name} "$@"\n'
        )
        shim.chmod(0o755)


def counted(log: Path) -> collections.Counter[str]:
    return collections.Counter(log.read_text().split()) if log.exists() else collections.Counter()


async def bench_dispatch(
    slurm: LocalSlurm, jobs: int, seconds: float, poll: str, log: Path
) -> dict[str, Any]:
    raw = {"slurmConf": str(slurm.conf), "workdir": str(slurm.workdir / "dispatch"), "pollInterval": poll}
    before = counted(log)
    backend = await open_backend(parse_settings(json.dumps(raw)))
    opening = counted(log) - before
    start = counted(log)
    t0 = time.monotonic()
    spec = JobSpec(command=("sleep", f"{seconds:g}"))
    handles = []
    ended: dict[str, str] = {}
    stream = backend.watch()

    async def follow() -> None:
        async for change in stream:
            if change.observation.outcome.terminal:
                ended[change.handle.ref] = str(change.observation.state)
                if len(ended) >= jobs and all(h.ref in ended for h in handles):
                    return

    watcher = asyncio.ensure_future(follow())
    for i in range(jobs):
        handles.append(await place(backend, spec, Identity(f"bench-{os.getpid()}-{i}")))
    async with asyncio.timeout(900):
        await watcher
    wall = time.monotonic() - t0
    await stream.aclose()
    await backend.close()
    used = counted(log) - start
    states = collections.Counter(ended[h.ref] for h in handles)
    return {
        "opening": dict(opening),
        "commands": dict(used),
        "wall_s": round(wall, 1),
        "states": dict(states),
    }


def bench_submitit(slurm: LocalSlurm, jobs: int, seconds: float, log: Path) -> dict[str, Any] | None:
    try:
        import submitit
    except ImportError:
        return None
    start = counted(log)
    t0 = time.monotonic()
    executor = submitit.AutoExecutor(folder=str(slurm.workdir / "submitit" / "%j"), cluster="slurm")
    executor.update_parameters(timeout_min=10, slurm_partition="batch", mem_gb=0.2)
    futures = [executor.submit(time.sleep, seconds) for _ in range(jobs)]
    for job in futures:
        job.result()
    wall = time.monotonic() - t0
    used = counted(log) - start
    states = collections.Counter(job.state for job in futures)
    return {"commands": dict(used), "wall_s": round(wall, 1), "states": dict(states)}


def per_job(commands: dict[str, int], jobs: int) -> str:
    total = sum(commands.values())
    slurm = sum(v for k, v in commands.items() if k.startswith("s"))  # sbatch squeue sacct scontrol scancel
    detail = ", ".join(f"{k} {v}" for k, v in sorted(commands.items()))
    return f"{total} commands ({slurm} Slurm), {total / jobs:.2f} per job [{detail}]"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--poll", default="2s", help="dispatch's pollInterval")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="slurm-bench-") as tmp:
        root = Path(tmp)
        log = root / "commands.log"
        make_shims(root / "shims", log)
        os.environ["PATH"] = f"{root / 'shims'}:{os.environ['PATH']}"
        slurm = LocalSlurm(root / "cluster", accounting=True)
        slurm.start()
        os.environ["SLURM_CONF"] = str(slurm.conf)
        try:
            log.unlink(missing_ok=True)
            mine = asyncio.run(bench_dispatch(slurm, args.jobs, args.seconds, args.poll, log))
            theirs = bench_submitit(slurm, args.jobs, args.seconds, log)
        finally:
            slurm.stop()
    print(f"{args.jobs} jobs of {args.seconds:g} s followed at once on a local Slurm (3 nodes x 4 CPUs):")
    print(
        f"  dispatch (poll {args.poll}): {per_job(mine['commands'], args.jobs)}; {mine['wall_s']} s; {mine['states']}"
    )
    print(f"    opening (once per process): {mine['opening']}")
    if theirs is None:
        print("  submitit: not installed (pip install -e '.[bench]')")
    else:
        print(
            f"  submitit: {per_job(theirs['commands'], args.jobs)}; {theirs['wall_s']} s; {theirs['states']}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
