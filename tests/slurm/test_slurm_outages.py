"""An outage changes nothing (SPEC §13), on every Slurm version: with slurmctld SIGKILLed, munged stopped
or the login node's ssh down, every reading is unreachable — never "the job is gone" —, a submit is not
a refusal, and a supervisor neither concludes `lost` nor cancels; once the daemon is back, the job is
read as it is."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from slurm_fixtures import Site

import dispatch
from dispatch import Cluster, Config, JobSpec, MemoryStore, UnavailableError, UnsupportedError
from dispatch.model import Observation, State
from dispatch_slurm import SlurmBackend
from dispatch_slurm.rootslurm import RootSlurm

pytestmark = pytest.mark.timeout(400)


@pytest_asyncio.fixture
async def cluster(site: Site) -> AsyncIterator[Cluster]:
    opened = await dispatch.open("slurm", Config(adapter=site.settings(), store=MemoryStore()))
    async with opened:
        yield opened


async def running(cluster: Cluster, job_id: str) -> None:
    async with asyncio.timeout(120):
        while True:
            if (await cluster.get(job_id)).state is State.RUNNING:
                return
            await asyncio.sleep(0.3)


async def answers_again(cluster: Cluster, job_id: str) -> State:
    """The job's state once the cluster answers again (slurmctld recovering, munge or sshd back)."""
    async with asyncio.timeout(120):
        while True:
            try:
                return (await cluster.get(job_id)).state
            except UnavailableError:
                await asyncio.sleep(0.5)


async def test_with_slurmctld_killed_every_reading_is_unreachable_and_nothing_changes(
    cluster: Cluster, site: Site
) -> None:
    """22.05's squeue --json answers "jobs": [] with an errors entry (exit 0) when slurmctld is down: read
    as an empty queue, a running job was `lost` and the supervisor scancelled it."""
    rec = await cluster.submit(JobSpec(command=("sleep", "600")), job_id="ctld-down")
    await running(cluster, rec.job_id)
    backend = cluster.backend
    assert isinstance(backend, SlurmBackend)
    changes: list[Observation] = []

    async def follow() -> None:
        async for change in backend.watch():
            changes.append(change.observation)

    watching = asyncio.ensure_future(follow())
    handle = (await cluster.record(rec.job_id)).handle
    assert handle is not None
    site.cluster.kill_controller()  # once its state is saved: the restarted one knows the job
    try:
        # Each reading waits out Slurm's own retries (about 10 s), and a controller down long enough has
        # Slurm mark the nodes down when it comes back: a reading, a verdict and a supervisor's step.
        with pytest.raises(UnavailableError):
            await cluster.get(rec.job_id)
        with pytest.raises(UnavailableError) as checked:
            await cluster.capabilities(JobSpec(command=("true",)))  # sbatch --test-only: not a refusal
        assert not isinstance(checked.value, UnsupportedError)
        report = await cluster.supervisor(poll=0.5).step()
        assert report.errors, report
        assert (await cluster.record(rec.job_id)).state is State.RUNNING
        await asyncio.sleep(1.5)  # three poll intervals without an answer
    finally:
        site.cluster.start_controller()
    assert await answers_again(cluster, rec.job_id) is State.RUNNING  # not scancelled, not lost
    await asyncio.sleep(1.0)
    watching.cancel()
    mine = [o for o in changes if o.handle.ref == handle.ref]
    assert mine and all(o.state is State.RUNNING for o in mine), mine
    await cluster.cancel(rec.job_id)


async def test_with_munge_stopped_a_submit_is_unreachable_not_refused_and_starts_later(
    cluster: Cluster, site: Site
) -> None:
    """A refusal while munge was down read as UnsupportedError ("Slurm would not run it"): the job
    failed `invalid_spec`. It is unreachable: the record stays pending, and starts once munge is back."""
    spec = JobSpec(command=("sh", "-c", "echo hello"))
    site.cluster.stop_munge()
    try:
        with pytest.raises(UnavailableError) as checked:
            await cluster.capabilities(spec)
        assert not isinstance(checked.value, UnsupportedError)
        assert "authentication" in str(checked.value).lower() or "munge" in str(checked.value).lower()
        with pytest.raises(UnavailableError):
            await cluster.submit(spec, job_id="munge-down")
        rec = await cluster.record("munge-down")
        assert rec.state is State.PENDING and rec.handle is None, rec.outcome
        with pytest.raises(UnavailableError):
            await cluster.backend.list()
    finally:
        site.cluster.start_munge()
    # resync: this supervisor lists the cluster each second (its watch of the Slurm poller is the lead's to
    # replace: each step's drain closes the watch before a poll completes).
    supervisor = cluster.supervisor(poll=0.5, resync=1.0)
    async with asyncio.timeout(120):
        while not (await cluster.record("munge-down")).outcome.terminal:
            await supervisor.step()
            await asyncio.sleep(0.5)
    assert (await cluster.record("munge-down")).state is State.SUCCEEDED


async def test_with_the_login_nodes_ssh_down_nothing_changes(cluster: Cluster, site: Site) -> None:
    """The ssh transport: a login node that cannot be reached (its sshd stopped, every connection cut)
    is unreachable for every reading and for a submit, which stays pending; the job runs on meanwhile."""
    if not isinstance(site.cluster, RootSlurm):
        pytest.skip("22.05 runs here through the local transport (its ssh runs in test_slurm_conformance)")
    rec = await cluster.submit(JobSpec(command=("sleep", "600")), job_id="ssh-down")
    await running(cluster, rec.job_id)
    site.cluster.stop_sshd()
    try:
        with pytest.raises(UnavailableError):
            await cluster.get(rec.job_id)
        with pytest.raises(UnavailableError):
            await cluster.backend.list()
        with pytest.raises(UnavailableError):
            await cluster.submit(JobSpec(command=("true",)), job_id="ssh-down-submit")
        assert (await cluster.record("ssh-down-submit")).state is State.PENDING
        report = await cluster.supervisor(poll=0.5).step()
        assert report.errors, report
        assert (await cluster.record(rec.job_id)).state is State.RUNNING
    finally:
        site.cluster.start_sshd()
    assert await answers_again(cluster, rec.job_id) is State.RUNNING
    await cluster.cancel(rec.job_id)
