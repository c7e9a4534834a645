"""The backend conformance suite (dispatch.conformance) on every Slurm version (``site``): this host's 22.05
over the local transport, 24.11 and 26.05 in Debian roots over ssh to their login node.

The harness's job waits for a control file (in the cluster's shared workdir) and then does what the
file says: exit with a code, or allocate past its memory limit. Events a real Slurm has are caused for
real: preemption by a job of the higher-tier partition on the same node, a lost node by killing its
slurmd by pid (restarted once the controller marks it down). Slurm has no eviction and no way to make a
job vanish from squeue and accounting, so those two checks are the only ones skipped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from slurm_fixtures import Site

from dispatch import Backend, Handle, JobSpec
from dispatch.conformance import *  # noqa: F403  (the checks: test_conformance_*)
from dispatch.conformance import BaseHarness
from dispatch_slurm import SlurmBackend, open_backend, parse_settings

pytestmark = pytest.mark.timeout(400)  # Slurm keeps time limits in minutes: the timeout check waits ~1-2 min

# One line: a command item may hold no line break (no cluster can pass one to a process).
CONTROL = (
    'echo "started on node $SLURM_NODEID"; ctl="$CONTROL_DIR/$DISPATCH_JOB_ID.$DISPATCH_EPOCH"; '
    'while [ ! -e "$ctl" ]; do sleep 0.2; done; what=$(cat "$ctl"); case "$what" in '
    "oom) exec python3 -c 'import time; b = bytearray(600 * 1024 * 1024); time.sleep(60)' ;; "
    '*) echo "exiting $what"; exit "$what" ;; esac'
)


class SlurmHarness(BaseHarness):
    name = "slurm"
    injects = frozenset({"succeed", "fail", "oom", "preempt", "lose_node"})
    step = 1.0
    patience = 200.0
    lingers = False  # a cancelled job may be gone before scancel returns

    def __init__(self, site: Site) -> None:
        self.site = site
        self.slurm = site.cluster
        self.raw: dict[str, Any] = site.settings()
        self.control = self.slurm.workdir / "control"
        self.preemptors: list[str] = []
        self.control.mkdir(parents=True, exist_ok=True)
        self.opened: list[Backend] = []
        self.killed: set[str] = set()

    async def open(self, *, read_only: bool = False) -> Backend:
        backend = await open_backend(parse_settings(json.dumps(self.raw)), read_only=read_only)
        self.opened.append(backend)
        return backend

    def spec(self) -> JobSpec:
        return JobSpec(command=("sh", "-c", CONTROL), env={"CONTROL_DIR": str(self.control)})

    def _say(self, handle: Handle, what: str) -> None:
        # Written aside and renamed: the job waits for the file to exist, then reads it, and could read
        # it empty between a write_text's create and its write (seen under load: "exit: Illegal number").
        final = self.control / f"{handle.identity.job_id}.{handle.identity.epoch}"
        aside = final.with_name(final.name + ".tmp")
        aside.write_text(what)
        aside.replace(final)

    async def fail(self, backend: Backend, handle: Handle, exit_code: int) -> None:
        self._say(handle, str(exit_code))

    async def succeed(self, backend: Backend, handle: Handle) -> None:
        self._say(handle, "0")

    async def oom(self, backend: Backend, handle: Handle) -> None:
        self._say(handle, "oom")

    async def _node(self, backend: Backend, handle: Handle) -> str:
        assert isinstance(backend, SlurmBackend)
        obs = await backend.observe(handle)
        node = obs.outcome.evidence[0].node
        assert node, obs
        return node

    async def preempt(self, backend: Backend, handle: Handle) -> None:
        self.preemptors.append(self.slurm.preempt(await self._node(backend, handle)))

    async def lose_node(self, backend: Backend, handle: Handle) -> None:
        node = await self._node(backend, handle)
        self.slurm.kill_node(node)
        self.killed.add(node)

    def _slurm(self, argv: list[str]) -> str:
        return self.site.slurm(*argv)

    async def settle(self) -> None:
        # Slurm works in real time: a settle is a short real wait (a poll interval is 500 ms).
        await asyncio.sleep(0.1)
        await super().settle()

    async def advance(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
        for node in sorted(self.killed):
            state = self._slurm(["sinfo", "-h", "-n", node, "-o", "%t"]).strip()
            if state.startswith("down"):
                self.slurm.start_node(node)
                self.killed.discard(node)

    async def close(self) -> None:
        for backend in self.opened:
            await backend.close()
        for node in sorted(self.killed):
            self.slurm.start_node(node)
        # The checks leave jobs waiting on their control files: cancel them, or the next checks' jobs
        # find the cluster full.
        listed = self._slurm(["squeue", "-h", "-t", "PENDING,RUNNING", "-o", "%i %j"]).split("\n")
        left = [
            line.split()[0] for line in listed if line.split()[1:2] and line.split()[1].startswith("d-conf-")
        ]
        if left:
            self._slurm(["scancel", *left])
        # A preempting job that has not run yet (a loaded machine) would preempt the next check's job when
        # it starts: a 26.05 out-of-memory check read "cancelled" so (its job could not be requeued).
        if self.preemptors:
            self.slurm.run("scancel", *self.preemptors)  # an ended one is refused: nothing to do


@pytest_asyncio.fixture
async def harness(site: Site) -> AsyncIterator[SlurmHarness]:
    h = SlurmHarness(site)
    yield h
    await h.close()


def test_the_slurm_harness_is_a_harness(site: Site) -> None:
    from dispatch.conformance import Harness

    assert isinstance(SlurmHarness(site), Harness)
