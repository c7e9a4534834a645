"""Record what a real Slurm says in each scenario, for the cause table's replay tests.

Starts a local Slurm in a temporary directory, runs each scenario through the slurm adapter, and
writes tests/slurm/transcripts/<scenario>.json: the job's ``squeue --json`` entry, its text ``sacct``
line (the completion log) and the last lines of its output, as Slurm gave them. Run it again after a
Slurm upgrade: ``python tools/record_slurm_transcripts.py`` (about two minutes).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from dispatch import JobSpec
from dispatch.backend import place
from dispatch.model import Handle, Identity
from dispatch_slurm import SlurmBackend, open_backend, parse_settings
from dispatch_slurm.localslurm import LocalSlurm
from dispatch_slurm.reader import SACCT_FIELDS

OUT = Path(__file__).resolve().parent.parent / "tests" / "slurm" / "transcripts"
OOM = "python3 -c 'import time; b = bytearray(600 * 1024 * 1024); time.sleep(60)'"


def _cmd(slurm: LocalSlurm, *argv: str) -> str:
    env = {**slurm.env(), "SLURM_TIME_FORMAT": "%s"}  # sacct's End as the adapter reads it: epoch seconds
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, check=False).stdout


async def _until_state(backend: SlurmBackend, slurm: LocalSlurm, ref: str, states: set[str]) -> None:
    for _ in range(600):
        for job in json.loads(_cmd(slurm, "squeue", "--json"))["jobs"]:
            if str(job["job_id"]) == ref and job["job_state"] in states:
                return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"job {ref} never reached {states}")


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="slurm-rec-") as tmp:
        slurm = LocalSlurm(Path(tmp))
        slurm.start()
        try:
            raw = {"slurmConf": str(slurm.conf), "workdir": str(slurm.workdir)}
            backend = await open_backend(parse_settings(json.dumps(raw)))
            jobs: dict[str, tuple[Identity, str]] = {}

            async def submit(name: str, script: str, nodes: int = 1, **kw: Any) -> str:
                identity = Identity(f"rec-{name}")
                held = bool(kw.pop("held", False))
                spec = JobSpec(command=("sh", "-c", script), nodes=nodes, **kw)
                h = await place(backend, spec, identity, held=held)
                jobs[name] = (identity, h.ref)
                return h.ref

            final = {"COMPLETED", "FAILED", "OUT_OF_MEMORY"}
            await _until_state(backend, slurm, await submit("completed", "echo hello", nodes=2), final)
            await _until_state(backend, slurm, await submit("exit3_two_nodes", "exit 3", nodes=2), final)
            await _until_state(backend, slurm, await submit("over_memory", OOM), final)
            await submit("held_by_dispatch", "sleep 600", held=True)

            def node_of(ref: str) -> str:
                queue = json.loads(_cmd(slurm, "squeue", "--json"))["jobs"]
                return str(next(j["nodes"] for j in queue if str(j["job_id"]) == ref))

            # One scenario at a time: a preemptor takes its whole node, a lost node takes every job on it.
            preempted = await submit("preempted", "sleep 600")
            await _until_state(backend, slurm, preempted, {"RUNNING"})
            slurm.preempt(node_of(preempted), seconds=2)
            await _until_state(backend, slurm, preempted, {"PREEMPTED"})
            ours = await submit("cancelled_by_dispatch", "sleep 600")
            theirs = await submit("cancelled_by_someone", "sleep 600")
            for ref in (ours, theirs):
                await _until_state(backend, slurm, ref, {"RUNNING"})
            await backend.stop(Handle("slurm", jobs["cancelled_by_dispatch"][0], ours))
            _cmd(slurm, "scancel", theirs)
            lost = await submit("node_fail", "sleep 600")
            await _until_state(backend, slurm, lost, {"RUNNING"})
            lost_node = node_of(lost)
            slurm.kill_node(lost_node)
            await _until_state(backend, slurm, lost, {"NODE_FAIL"})
            slurm.start_node(lost_node)
            await _until_state(backend, slurm, await submit("running", "sleep 600"), {"RUNNING"})
            await _until_state(
                backend, slurm, await submit("timeout", "sleep 600", time_limit=5), {"TIMEOUT"}
            )
            await asyncio.sleep(2)
            queue = {str(j["job_id"]): j for j in json.loads(_cmd(slurm, "squeue", "--json"))["jobs"]}
            sacct_argv = ["sacct", "-c", "-X", "-P", "-n", "--duplicates", "-o", SACCT_FIELDS]
            accounted = {line.split("|")[0]: line for line in _cmd(slurm, *sacct_argv).splitlines()}
            OUT.mkdir(parents=True, exist_ok=True)
            for name, (identity, ref) in jobs.items():
                directory = slurm.workdir / backend.native_name(identity)
                output: list[str] = []
                for f in [*sorted(directory.glob("node-*.out")), directory / "batch.out"]:
                    if f.exists():
                        output += f.read_text().splitlines()[-20:]
                record = {
                    "recorded": f"Slurm {backend.info.version}, {time.strftime('%Y-%m-%d')}",
                    "identity": str(identity),
                    "squeue": queue.get(ref),
                    "sacct": accounted.get(ref, ""),
                    "output": output,
                }
                (OUT / f"{name}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
                print(f"{name}: job {ref} {queue[ref]['job_state'] if ref in queue else '?'}")
            for ref in queue:
                _cmd(slurm, "scancel", ref)
            await backend.close()
        finally:
            slurm.stop()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
