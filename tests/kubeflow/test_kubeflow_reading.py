"""One reading path (SPEC §9.6) over real HTTP on kubesim: every reader of a process shares one list+watch
per kind; ``Cluster.watch(job_id)`` follows the shared feed and sees a deletion by another tool."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from kubeflow_live import Live, job, live

import dispatch
from dispatch import Cause, JobRecord, State
from kubesim.resources import TRAINJOBS


@pytest_asyncio.fixture
async def lv(tmp_path: Path) -> AsyncIterator[Live]:
    async for x in live(tmp_path):
        yield x


async def _follow(cluster: dispatch.Cluster, job_id: str, seen: list[JobRecord]) -> None:
    async for rec in cluster.watch(job_id):
        seen.append(rec)


async def test_watch_of_one_job_sees_a_background_deletion_by_another_tool_as_lost(lv: Live) -> None:
    backend = await lv.open()
    cluster = dispatch.Cluster(backend, dispatch.MemoryStore())
    rec = await cluster.submit(job(), job_id="deleted-elsewhere")
    assert rec.handle is not None
    records = cluster.watch(rec.job_id)
    first = await anext(records)
    assert not first.outcome.terminal, first.outcome
    # While the job lives, another tool deletes it with kubectl's default, Background propagation: the
    # TrainJob goes at once, its JobSet and pods after it (the garbage collector).
    lv.sim.store.delete(TRAINJOBS, "default", rec.handle.ref.partition("/")[2], propagation="Background")
    following = asyncio.ensure_future(anext(records))
    try:
        await lv.until(following.done, "the watch of the job reports the deletion")
        last = following.result()
    finally:
        following.cancel()
        with contextlib.suppress(BaseException):
            await following
        await records.aclose()
    assert (last.state, last.outcome.cause) == (State.LOST, Cause.UNKNOWN), last.outcome
    assert (await cluster.get(rec.job_id)).state is State.LOST


async def test_many_watches_of_single_jobs_cost_one_list_and_watch_per_kind(lv: Live) -> None:
    backend = await lv.open()
    cluster = dispatch.Cluster(backend, dispatch.MemoryStore())
    recs = [await cluster.submit(job(), job_id=f"many-{i}") for i in range(8)]
    before = lv.sim.requests.total
    seen: dict[str, list[JobRecord]] = {r.job_id: [] for r in recs}
    followers = [asyncio.ensure_future(_follow(cluster, r.job_id, seen[r.job_id])) for r in recs]
    try:
        await lv.until(
            lambda: all(s and s[-1].state is State.RUNNING for s in seen.values()), "every job running"
        )
    finally:
        for f in followers:
            f.cancel()
    sent = list(lv.sim.requests)[before - lv.sim.requests.total :]
    streams = [r for r in sent if r.verb in ("list", "watch")]
    assert not streams, (
        f"a watch of one job opened its own list/watch: {[(r.verb, r.resource) for r in streams]}"
    )
    # each watch(job_id) reads its job once (get: the TrainJob), nothing per kind
    assert len(sent) <= len(recs), [(r.verb, r.path) for r in sent]
