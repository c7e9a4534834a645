"""What the tests' Slurm clusters cost: start (to every node idle) and stop, per version, with and without
accounting, and making a Debian root when it is already made.

Run: .venv/bin/python benchmarks/slurm_clusters_bench.py [--runs 3] [--versions 22.05 24.11 26.05]
(the roots must be made: ``python -m dispatch_slurm.debroot make``; a cold make is timed by that command,
which prints how long it took).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from dispatch_slurm.debroot import RELEASES, make_root  # noqa: E402
from dispatch_slurm.localslurm import LocalSlurm  # noqa: E402
from dispatch_slurm.rootslurm import RootSlurm  # noqa: E402


def _cluster(version: str, directory: Path, accounting: bool) -> LocalSlurm | RootSlurm:
    if version == "22.05":
        return LocalSlurm(directory, accounting=accounting)
    return RootSlurm(directory, make_root(version), accounting=accounting)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--versions", nargs="*", default=["22.05", *RELEASES])
    args = parser.parse_args()
    print("| version | accounting | start s (median) | stop s (median) | root made already s |")
    print("| --- | --- | --- | --- | --- |")
    for version in args.versions:
        warm = "—"
        if version != "22.05":
            t = time.monotonic()
            make_root(version)
            warm = f"{time.monotonic() - t:.2f}"
        for accounting in (False, True):
            starts, stops = [], []
            for _ in range(args.runs):
                with tempfile.TemporaryDirectory(prefix="slurm-bench-") as tmp:
                    cluster = _cluster(version, Path(tmp), accounting)
                    t = time.monotonic()
                    try:
                        cluster.start()
                        starts.append(time.monotonic() - t)
                    finally:
                        t = time.monotonic()
                        cluster.stop()
                        stops.append(time.monotonic() - t)
            print(
                f"| {version} | {'yes' if accounting else 'no'} | {statistics.median(starts):.2f} "
                f"| {statistics.median(stops):.2f} | {warm} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
