"""Record what real Slurms say in each scenario, for the reader's and the cause table's replay tests.

For each version (this host's 22.05, and 24.11 and 26.05 in their Debian roots: ``python -m
dispatch_slurm.debroot make``) it starts a cluster with accounting (slurmdbd and MariaDB) and a
completion log, runs each scenario through the slurm adapter (or as an admin would, with Slurm's own
commands), and writes ``tests/slurm/transcripts/<version>/<scenario>.json``:

- ``squeue``: the job's entry of ``squeue --json`` (``squeue_argv``: with ``--states=all`` from 23.02 on,
  whose squeue applies its default state filter to ``--json`` too), taken at the end, or at the moment
  the scenario shows its state (``suspended``, ``held_after_requeue``: a later listing shows another);
- ``sacct``: the job's line of the completion log (``sacct -c -X -P -n --duplicates``, with
  ``SLURM_TIME_FORMAT=%s`` as the adapter runs it), what a cluster
  without a database answers; ``sacct_db``: its line of the same ``sacct`` without ``-c`` (slurmdbd), and
  ``sacct_json``: its entries of ``sacct --json``, what a real site answers;
- ``output``: the last lines of its batch and node output files.

and ``<version>/scontrol-show-config.accounting.txt`` (what opening reads, on a cluster with accounting). Run it after a Slurm upgrade:
``python tools/record_slurm_transcripts.py [22.05 24.11 26.05]`` (about three minutes per version: the
time limit scenario waits for Slurm's once-a-minute check).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dispatch import JobSpec
from dispatch.backend import place
from dispatch.model import Handle, Identity
from dispatch_slurm import SlurmBackend, open_backend, parse_settings
from dispatch_slurm.debroot import RELEASES, find_root, slurm_version
from dispatch_slurm.localslurm import LocalSlurm
from dispatch_slurm.reader import SACCT_FIELDS
from dispatch_slurm.rootslurm import RootSlurm

OUT = Path(__file__).resolve().parent.parent / "tests" / "slurm" / "transcripts"
OOM = "python3 -c 'import time; b = bytearray(600 * 1024 * 1024); time.sleep(60)'"
VERSIONS = ("22.05", *RELEASES)
FINAL = {"COMPLETED", "FAILED", "OUT_OF_MEMORY", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED"}


def _states(entry: dict[str, Any]) -> set[str]:
    """``job_state`` of an squeue --json entry: a string up to 22.05, a list of state and flags since."""
    state = entry.get("job_state")
    return set(state) if isinstance(state, list) else {str(state)}


class Recorder:
    def __init__(self, cluster: LocalSlurm | RootSlurm, backend: SlurmBackend, version: str) -> None:
        self.cluster = cluster
        self.backend = backend
        self.version = version
        # 22.05 ignores squeue's filters with --json; later versions filter ended jobs out by default.
        self.squeue_argv = ["squeue", "--json"] + ([] if version == "22.05" else ["--states=all"])
        self.jobs: dict[str, tuple[Identity, str]] = {}
        self.snapshots: dict[str, dict[str, Any]] = {}

    def run(self, *argv: str) -> str:
        done = self.cluster.run(*argv)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def listing(self) -> dict[str, dict[str, Any]]:
        return {str(j["job_id"]): j for j in json.loads(self.run(*self.squeue_argv))["jobs"]}

    async def submit(self, name: str, script: str, nodes: int = 1, **kw: Any) -> str:
        identity = Identity(f"rec-{name}")
        held = bool(kw.pop("held", False))
        spec = JobSpec(command=("sh", "-c", script), nodes=nodes, **kw)
        handle = await place(self.backend, spec, identity, held=held)
        self.jobs[name] = (identity, handle.ref)
        return handle.ref

    def handle(self, name: str) -> Handle:
        identity, ref = self.jobs[name]
        return Handle("slurm", identity, ref)

    async def until(self, ref: str, states: set[str], seconds: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            entry = self.listing().get(ref)
            if entry is not None and _states(entry) & states:
                return entry
            await asyncio.sleep(0.5)
        raise RuntimeError(f"job {ref} never reached {states}")

    def node_of(self, ref: str) -> str:
        return str(self.listing()[ref]["nodes"])

    async def scenarios(self) -> None:
        await self.until(await self.submit("completed", "echo hello", nodes=2), FINAL)
        await self.until(await self.submit("exit3_two_nodes", "exit 3", nodes=2), FINAL)
        await self.until(await self.submit("over_memory", OOM), FINAL)
        await self.submit("held_by_dispatch", "sleep 600", held=True)

        # One scenario at a time: a preemptor takes its whole node, a lost node takes every job on it.
        preempted = await self.submit("preempted", "sleep 600")
        await self.until(preempted, {"RUNNING"})
        self.cluster.preempt(self.node_of(preempted), seconds=2)
        await self.until(preempted, {"PREEMPTED"})

        ours = await self.submit("cancelled_by_dispatch", "sleep 600")
        theirs = await self.submit("cancelled_by_someone", "sleep 600")
        for ref in (ours, theirs):
            await self.until(ref, {"RUNNING"})
        await self.backend.stop(self.handle("cancelled_by_dispatch"))
        self.run("scancel", theirs)

        step = await self.submit("step_cancelled_by_someone", "sleep 600")
        await self.until(step, {"RUNNING"})
        await self._until_step(step)
        self.run("scancel", f"{step}.0")
        await self.until(step, FINAL)

        suspended = await self.submit("suspended", "sleep 600")
        await self.until(suspended, {"RUNNING"})
        self.run("scontrol", "suspend", suspended)
        self.snapshots["suspended"] = await self.until(suspended, {"SUSPENDED"})
        self.run("scontrol", "resume", suspended)

        requeued = await self.submit("held_after_requeue", "sleep 600")
        await self.until(requeued, {"RUNNING"})
        await self.backend.hold(self.handle("held_after_requeue"))
        self.snapshots["held_after_requeue"] = self.listing()[requeued]

        lost = await self.submit("node_fail", "sleep 600")
        await self.until(lost, {"RUNNING"})
        lost_node = self.node_of(lost)
        self.cluster.kill_node(lost_node)
        await self.until(lost, {"NODE_FAIL"})
        self.cluster.start_node(lost_node)

        await self.until(await self.submit("running", "sleep 600"), {"RUNNING"})
        await self.until(await self.submit("timeout", "sleep 600", time_limit=5), {"TIMEOUT"})

    async def _until_step(self, ref: str) -> None:
        for _ in range(600):
            if f"{ref}.0" in self.run("squeue", "-h", "-s", "-j", ref, "-o", "%i").split():
                return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"job {ref} never started its step")

    def write(self, out: Path) -> None:
        time.sleep(2)  # the last ends reach the completion log and the database
        queue = self.listing()
        # End as the adapter reads it: epoch seconds, whatever the login node's zone.
        fields = [
            "env",
            "SLURM_TIME_FORMAT=%s",
            "sacct",
            "-X",
            "-P",
            "-n",
            "--duplicates",
            "-o",
            SACCT_FIELDS,
        ]
        jobcomp = _lines(self.run(*fields, "-c"))
        database = _lines(self.run(*fields))
        accounted = json.loads(self.run("sacct", "--json"))["jobs"]
        out.mkdir(parents=True, exist_ok=True)
        (out / "scontrol-show-config.accounting.txt").write_text(self.run("scontrol", "show", "config"))
        recorded = f"Slurm {self.backend.info.version}, {time.strftime('%Y-%m-%d')}"
        for name, (identity, ref) in self.jobs.items():
            directory = self.cluster.workdir / self.backend.native_name(identity)
            output: list[str] = []
            for f in [*sorted(directory.glob("node-*.out")), directory / "batch.out"]:
                if f.exists():
                    output += f.read_text().splitlines()[-20:]
            entry = self.snapshots.get(name, queue.get(ref))
            record = {
                "recorded": recorded,
                "identity": str(identity),
                "squeue_argv": self.squeue_argv,
                "squeue": entry,
                "sacct": jobcomp.get(ref, ""),
                "sacct_db": database.get(ref, ""),
                "sacct_json": [j for j in accounted if str(j.get("job_id")) == ref],
                "output": output,
            }
            (out / f"{name}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
            print(f"{self.version} {name}: job {ref} {sorted(_states(entry)) if entry else '?'}")
        for ref in queue:
            self.cluster.run("scancel", ref)


def _lines(text: str) -> dict[str, str]:
    """Each job's last line (``--duplicates`` lists a requeued job's attempts in order)."""
    return {line.split("|")[0]: line for line in text.splitlines() if line.strip()}


async def record(version: str) -> None:
    with tempfile.TemporaryDirectory(prefix=f"slurm-rec-{version}-") as tmp:
        cluster: LocalSlurm | RootSlurm
        if version == "22.05":
            cluster = LocalSlurm(Path(tmp), accounting=True)
        else:
            root = find_root(version)
            if root is None:
                raise SystemExit(
                    f"no root for Slurm {version}: python -m dispatch_slurm.debroot make {version}"
                )
            print(f"Slurm {slurm_version(root)} from {root}")
            cluster = RootSlurm(Path(tmp), root, accounting=True)
        cluster.start()
        try:
            backend = await open_backend(parse_settings(json.dumps(cluster.settings())))
            try:
                recorder = Recorder(cluster, backend, version)
                await recorder.scenarios()
                recorder.write(OUT / version)
            finally:
                await backend.close()
        finally:
            cluster.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("versions", nargs="*", help=f"of {', '.join(VERSIONS)} (default: every one)")
    versions = parser.parse_args(argv).versions or list(VERSIONS)
    unknown = [v for v in versions if v not in VERSIONS]
    if unknown:
        parser.error(f"no cluster of Slurm {', '.join(unknown)}: choose from {', '.join(VERSIONS)}")
    for version in versions:
        asyncio.run(record(version))
    return 0


if __name__ == "__main__":
    sys.exit(main())
