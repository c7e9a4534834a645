"""The host's feed on every Slurm version (``site``), and the record's nonce: what the Slurm adapter's own
poller and names got wrong.

- a supervisor's step reads the watch for what it holds and closes it at once: the poll that watch started
  must still land, so the next step folds a job's end (the old poller was cancelled with the watch, and
  supervised Slurm jobs were folded only at the next resync);
- the batch script's end marker brings the poll forward when every watched job has ended, whatever the
  poll interval: Slurm's answer, read then, is what the record takes;
- a job id used again — after ``purge``, or by another store — never binds the old Slurm job: the new
  command runs, with its own output and exit code (issue 35: ``submitted inj-2@1.0: succeeded``, the
  handle of a job of 20 minutes before).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from slurm_fixtures import Site

import dispatch
from dispatch import Cluster, Config, JobRecord, JobSpec, MemoryStore
from dispatch.backend import place
from dispatch.model import Cause, Identity, Observation, State
from dispatch_slurm import SlurmBackend, open_backend, parse_settings

pytestmark = pytest.mark.timeout(300)

_n = iter(range(1, 10_000))


def sh(script: str) -> JobSpec:
    return JobSpec(command=("sh", "-c", script))


def waiting(control: str) -> JobSpec:
    """A job that runs until the file ``control`` exists, then exits with the code it holds."""
    return sh(f'while [ ! -e {control} ]; do sleep 0.2; done; exit "$(cat {control})"')


@pytest_asyncio.fixture
async def cluster(site: Site) -> AsyncIterator[Cluster]:
    opened = await dispatch.open("slurm", Config(adapter=site.settings(), store=MemoryStore()))
    async with opened:
        yield opened


async def ended(cluster: Cluster, job_id: str) -> JobRecord:
    async with asyncio.timeout(150):
        while True:
            rec = await cluster.get(job_id)
            if rec.outcome.terminal:
                return rec
            await asyncio.sleep(0.5)


async def test_a_supervisors_step_folds_a_jobs_end_without_waiting_for_a_resync(cluster: Cluster) -> None:
    """Each step drains the watch and closes it; the poll it started lands in the feed meanwhile, and a
    later step's drain folds it. The resync (a full listing) is an hour away: only the watch can say."""
    supervisor = cluster.supervisor(poll=0.2, resync=3600.0)
    await supervisor.step()  # the first step's resync: the record does not exist yet
    rec = await cluster.submit(sh("sleep 1"), job_id=f"stepped-{next(_n)}")
    try:
        async with asyncio.timeout(120):
            while not (await cluster.record(rec.job_id)).outcome.terminal:
                await supervisor.step()
                await asyncio.sleep(0.3)
    finally:
        await supervisor.close()
    done = await cluster.record(rec.job_id)
    assert (done.state, done.outcome.cause) == (State.SUCCEEDED, Cause.NONE), done.outcome
    assert any(
        t.actor.value == "cluster" and t.state is State.SUCCEEDED for t in await cluster.history(rec.job_id)
    )


async def test_the_end_marker_brings_the_last_poll_forward(site: Site) -> None:
    """With a poll every two minutes, a watched job's end is read as soon as its batch script wrote its
    marker — by a poll of Slurm (squeue says COMPLETED/FAILED), not by the marker — and no regular poll
    was needed for it: not to start the watch (sbatch's answer is the feed's current reading), nor to
    look at the marker of a job the feed still holds queued (it never saw it run)."""
    backend = await open_backend(parse_settings(json.dumps(site.settings(pollInterval="120s"))))
    control = site.cluster.workdir / f"marker-{next(_n)}"
    try:
        h = await place(backend, waiting(str(control)), Identity(f"marker-{next(_n)}"))
        async with asyncio.timeout(120):
            while True:
                if (await backend.observe(h)).state is State.RUNNING:  # type: ignore[union-attr]
                    break
                await asyncio.sleep(0.3)
        changes = backend.watch_job(h.identity.job_id)
        seen: list[Observation] = []
        async with asyncio.timeout(60):  # half the poll interval: only the marker can bring the end
            async for change in changes:
                assert isinstance(change.reading, Observation), change.reading
                seen.append(change.reading)
                if not control.exists():
                    control.write_text("3")
                if change.reading.outcome.terminal and change.reading.compute.value == "gone":
                    break
        await changes.aclose()  # type: ignore[attr-defined]
        assert seen[0].state is State.QUEUED, seen[0]  # the feed's reading from sbatch: no poll ran
        last = seen[-1]
        assert (last.state, last.cause) == (State.FAILED, Cause.EXIT_CODE), last.outcome
        assert last.outcome.evidence[0].exit_code == 3
        assert backend.early_polls >= 1
        assert backend.polls == backend.early_polls, (backend.polls, backend.early_polls)
    finally:
        await backend.close()


async def test_a_watch_right_after_the_submits_lists_nothing_and_polls_once_all_ended(site: Site) -> None:
    """``Cluster.watch()`` right after ``Cluster.submit`` of every job: the store knows each job from
    sbatch's answer, so the watch starts without a listing; the jobs wait for slots and run, and the one
    ``squeue`` that reads them ended is brought forward by their end markers (the interval is two minutes):
    one Slurm command per job and one for all of them."""
    raw = site.settings(pollInterval="120s")
    cluster = await dispatch.open("slurm", Config(adapter=raw, store=MemoryStore()))
    async with cluster:
        backend = cluster.backend
        assert isinstance(backend, SlurmBackend)
        counts = backend.transport.counts
        before = dict(counts)
        # More jobs than the cluster's 12 slots (3 nodes x 4 CPUs): some wait while others end.
        ids = [(await cluster.submit(sh("sleep 1"))).job_id for _ in range(14)]
        done: dict[str, JobRecord] = {}
        async with asyncio.timeout(100):  # less than the interval: the markers bring the poll
            async for rec in cluster.watch():
                if rec.job_id in ids and rec.outcome.terminal:
                    done[rec.job_id] = rec
                    if len(done) == len(ids):
                        break
        assert {r.state for r in done.values()} == {State.SUCCEEDED}, done
        ran = {k: counts.get(k, 0) - before.get(k, 0) for k in ("squeue", "scontrol", "sacct")}
        assert ran["scontrol"] == ran["sacct"] == 0, ran
        assert 1 <= ran["squeue"] <= 4 and ran["squeue"] == backend.polls == backend.early_polls, (
            ran,
            backend.polls,
            backend.early_polls,
        )


async def test_a_watch_that_starts_after_a_listing_starts_from_it(site: Site) -> None:
    """``Cluster.watch()`` lists, then watches: the listing is the same ``squeue`` a poll makes, so its
    readings go to the feed and the watch starts from them, with no poll of its own (each watch began with
    one: two listings to start a watch, one of them wasted)."""
    backend = await open_backend(parse_settings(json.dumps(site.settings(pollInterval="120s"))))
    h = await place(backend, sh("sleep 120"), Identity(f"listed-{next(_n)}"))
    try:
        async with asyncio.timeout(120):
            while True:
                if any(o.handle.ref == h.ref and o.state is State.RUNNING for o in await backend.list()):
                    break
                await asyncio.sleep(0.3)
        changes = backend.watch()
        async with asyncio.timeout(30):  # the interval is 120 s: only the listing can have this reading
            async for change in changes:
                if change.reading.handle.ref == h.ref:
                    break
        await changes.aclose()  # type: ignore[attr-defined]
        assert isinstance(change.reading, Observation) and change.reading.state is State.RUNNING, change
        assert backend.polls == 0, backend.polls
    finally:
        await backend.stop(h)
        await backend.close()


async def test_a_job_id_used_again_after_purge_or_by_another_store_is_a_new_job(
    cluster: Cluster, site: Site
) -> None:
    """The old Slurm job of a purged record (same store, same job id, same incarnation number) and that of
    another store's record are never the new record's: each new command runs, with its own output and
    exit code."""
    job_id = f"again-{next(_n)}"
    first = await cluster.submit(sh("echo first"), job_id=job_id)
    assert (await ended(cluster, job_id)).state is State.SUCCEEDED
    assert await cluster.purge(time.time() + 1) == 1
    second = await cluster.submit(sh("echo second; exit 7"), job_id=job_id)
    assert first.handle is not None and second.handle is not None
    assert second.handle.ref != first.handle.ref and second.nonce != first.nonce
    rec = await ended(cluster, job_id)
    assert (rec.state, rec.outcome.cause) == (State.FAILED, Cause.EXIT_CODE), rec.outcome
    assert rec.outcome.evidence[0].exit_code == 7
    assert [line async for line in cluster.output(job_id)] == ["second"]
    other = await dispatch.open("slurm", Config(adapter=site.settings(), store=MemoryStore()))
    async with other:
        third = await other.submit(sh("echo third; exit 5"), job_id=job_id)
        assert third.handle is not None and third.handle.ref not in (first.handle.ref, second.handle.ref)
        theirs = await ended(other, job_id)
        assert (theirs.state, theirs.outcome.evidence[0].exit_code) == (State.FAILED, 5), theirs.outcome
        assert [line async for line in other.output(job_id)] == ["third"]
    assert (await cluster.get(job_id)).outcome.evidence[0].exit_code == 7  # ours untouched by theirs


async def test_a_marker_beside_a_job_waiting_again_brings_no_more_polls(site: Site) -> None:
    """A job requeued after it ended (``scontrol requeuehold``: pending again, held) keeps the marker its
    first run wrote until it starts again. Once a listing shows it waiting, one early poll finds it still
    waiting beside that marker; after that the old marker counts for nothing — no early poll every few
    seconds while it waits (the interval is two minutes)."""
    raw = site.settings(pollInterval="120s", requeue="slurm")
    backend = await open_backend(parse_settings(json.dumps(raw)))
    try:
        h = await place(backend, sh("true"), Identity(f"requeued-{next(_n)}"))
        changes = backend.watch_job(h.identity.job_id)
        async with asyncio.timeout(60):  # the marker brings the poll that reads the end
            async for change in changes:
                if change.reading.outcome.terminal and change.reading.compute.value == "gone":
                    break
            site.slurm("scontrol", "requeuehold", h.ref)
            while not any(o.handle.ref == h.ref and not o.outcome.terminal for o in await backend.list()):  # noqa: ASYNC110
                await asyncio.sleep(0.3)
        early = backend.early_polls
        await asyncio.sleep(16)  # without the rule: early polls 1, 2, 4 and 8 s later
        assert backend.early_polls - early <= 1, (early, backend.early_polls)
        assert backend.polls == backend.early_polls  # no regular poll: all of them were early ones
        await changes.aclose()  # type: ignore[attr-defined]
    finally:
        site.slurm("scancel", h.ref)
        await backend.close()
