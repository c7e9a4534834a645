"""An outage changes nothing (SPEC §13): with slurmctld SIGKILLed or munged stopped, on the real local
Slurm, every reading is unreachable — never "the job is gone" —, a submit is not a refusal, and a
supervisor neither concludes `lost` nor cancels; once the daemon is back, the job is read as it is."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

import dispatch
from dispatch import Cluster, Config, JobSpec, MemoryStore, UnavailableError, UnsupportedError
from dispatch.model import Observation, State
from dispatch_slurm import SlurmBackend
from dispatch_slurm.localslurm import LocalSlurm

pytestmark = pytest.mark.timeout(300)


@pytest_asyncio.fixture
async def cluster(slurm: LocalSlurm) -> AsyncIterator[Cluster]:
    raw = {"slurmConf": str(slurm.conf), "workdir": str(slurm.workdir), "pollInterval": "500ms"}
    opened = await dispatch.open("slurm", Config(adapter=raw, store=MemoryStore()))
    async with opened:
        yield opened


async def running(cluster: Cluster, job_id: str) -> None:
    async with asyncio.timeout(120):
        while True:
            if (await cluster.get(job_id)).state is State.RUNNING:
                return
            await asyncio.sleep(0.3)


async def answers_again(cluster: Cluster, job_id: str) -> State:
    """The job's state once the cluster answers again (slurmctld recovering, munge back)."""
    async with asyncio.timeout(120):
        while True:
            try:
                return (await cluster.get(job_id)).state
            except UnavailableError:
                await asyncio.sleep(0.5)


def saved_since(slurm: LocalSlurm, since: float) -> bool:
    """Whether slurmctld saved its job state after ``since`` (a SIGKILLed controller recovers from it)."""
    state = Path(slurm.root) / "state" / "job_state"
    return state.exists() and state.stat().st_mtime >= since


async def test_with_slurmctld_killed_every_reading_is_unreachable_and_nothing_changes(
    cluster: Cluster, slurm: LocalSlurm
) -> None:
    """22.05's squeue --json answers "jobs": [] with an errors entry (exit 0) when slurmctld is down: read
    as an empty queue, a running job was `lost` and the supervisor scancelled it."""
    rec = await cluster.submit(JobSpec(command=("sleep", "600")))
    await running(cluster, rec.job_id)
    seen_running = time.time()
    async with asyncio.timeout(60):
        while True:
            if saved_since(slurm, seen_running):
                break
            await asyncio.sleep(0.2)
    backend = cluster.backend
    assert isinstance(backend, SlurmBackend)
    changes: list[Observation] = []

    async def follow() -> None:
        async for change in backend.watch():
            changes.append(change.observation)

    watching = asyncio.ensure_future(follow())
    handle = (await cluster.record(rec.job_id)).handle
    assert handle is not None
    slurm.kill_controller()
    try:
        for read in (lambda: cluster.get(rec.job_id), backend.list, lambda: backend.ceased(handle)):
            with pytest.raises(UnavailableError) as caught:
                await read()  # type: ignore[no-untyped-call]
            assert "slurm controller" in str(caught.value).lower() or "slurm_load_jobs" in str(caught.value)
        with pytest.raises(UnavailableError):
            await cluster.capabilities(JobSpec(command=("true",)))  # sbatch --test-only: not a refusal
        report = await cluster.supervisor(poll=0.5).step()
        assert report.errors, report
        assert (await cluster.record(rec.job_id)).state is State.RUNNING
        await asyncio.sleep(1.5)  # three poll intervals without an answer
    finally:
        slurm.start_controller()
    assert await answers_again(cluster, rec.job_id) is State.RUNNING  # not scancelled, not lost
    await asyncio.sleep(1.0)
    watching.cancel()
    mine = [o for o in changes if o.handle.ref == handle.ref]
    assert mine and all(o.state is State.RUNNING for o in mine), mine
    await cluster.cancel(rec.job_id)


async def test_with_munge_stopped_a_submit_is_unreachable_not_refused_and_starts_later(
    cluster: Cluster, slurm: LocalSlurm
) -> None:
    """A refusal while munge was down read as UnsupportedError ("Slurm would not run it"): the job
    failed `invalid_spec`. It is unreachable: the record stays pending, and starts once munge is back."""
    spec = JobSpec(command=("sh", "-c", "echo hello"))
    slurm.stop_munge()
    try:
        with pytest.raises(UnavailableError) as checked:
            await cluster.capabilities(spec)
        assert not isinstance(checked.value, UnsupportedError)
        assert "authentication" in str(checked.value).lower()
        with pytest.raises(UnavailableError) as submitted:
            await cluster.submit(spec, job_id="munge-down")
        assert "authentication" in str(submitted.value).lower()
        rec = await cluster.record("munge-down")
        assert rec.state is State.PENDING and rec.handle is None, rec.outcome
        with pytest.raises(UnavailableError):
            await cluster.backend.list()
    finally:
        slurm.start_munge()
    # resync: this supervisor lists the cluster each second (its watch of the Slurm poller is the lead's to
    # replace: each step's drain closes the watch before a poll completes).
    supervisor = cluster.supervisor(poll=0.5, resync=1.0)
    async with asyncio.timeout(120):
        while not (await cluster.record("munge-down")).outcome.terminal:
            await supervisor.step()
            await asyncio.sleep(0.5)
    assert (await cluster.record("munge-down")).state is State.SUCCEEDED
