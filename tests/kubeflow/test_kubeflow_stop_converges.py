"""A stop converges on Trainer v2.3.0 (SPEC §9.6 Cessation), on kubesim with the recreation loop on: the
Trainer re-applies the JobSet after each garbage collection while its TrainJob is deleted in the
foreground, so a foreground delete never ends. dispatch suspends first, then deletes in the background;
every pod goes, the record says ``cancelled`` only then, and the DELETEs are bounded (kubesim's request
log)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from kubeflow_fixtures import ident
from kubeflow_live import Live, job, live

from dispatch import Absent, Action, Cause, Compute, Epoch, ManualClock, Observation, Policy, Rule, State
from dispatch.backend import place
from dispatch.cluster import Cluster
from dispatch.records import MemoryStore
from kubesim.errors import ApiError
from kubesim.resources import JOBSETS, TRAINJOBS


@pytest_asyncio.fixture
async def lv(tmp_path: Path) -> AsyncIterator[Live]:
    async for x in live(tmp_path, recreate_jobset_while_deleting=True):
        yield x


def _exists(lv: Live, rt: object, name: str) -> bool:
    try:
        lv.sim.store.get(rt, "default", name)  # type: ignore[arg-type]
    except ApiError:
        return False
    return True


def _deletes(lv: Live, job_id: str) -> int:
    """DELETEs of the job's TrainJobs (not the preflight probe's)."""
    return sum(
        1 for r in lv.sim.requests.filter(verb="delete", resource="trainjobs") if f"/{job_id}-" in r.path
    )


async def test_the_loop_is_on_a_foreground_delete_never_ends(lv: Live) -> None:
    """The control: what a foreground delete does here (what dispatch's stop used to send)."""
    backend = await lv.open()
    h = await place(backend, job(nodes=2), ident("control"))
    await lv.until(lambda: len(lv.pods(h)) == 2, "running")
    name = h.ref.split("/", 1)[1]
    lv.sim.store.delete(TRAINJOBS, "default", name, propagation="Foreground")
    await lv.until(lambda: not lv.pods(h, live=False), "the first pods gone")
    await lv.until(lambda: bool(lv.pods(h, live=False)), "pods back", limit=30)
    assert _exists(lv, TRAINJOBS, name)


async def test_stop_suspends_then_deletes_in_the_background_and_every_pod_goes(lv: Live) -> None:
    backend = await lv.open()
    h = await place(backend, job(nodes=2), ident("stopper"))
    await lv.until(
        lambda: len(lv.pods(h)) == 2 and all(p["status"]["phase"] == "Running" for p in lv.pods(h)), "running"
    )
    name = h.ref.split("/", 1)[1]
    await backend.stop(h)
    patches = [r for r in lv.sim.requests.filter(verb="patch", resource="trainjobs") if "/stopper-" in r.path]
    assert len(patches) == 1, "suspended before the delete"
    while not await backend.ceased(h):
        obs = await backend.observe(h)
        if isinstance(obs, Observation):  # never ended while compute of it remains
            assert obs.compute is Compute.GONE or not obs.outcome.terminal, obs
        await backend.stop(h)  # as a supervisor does at each poll: no DELETE while one is under way
        lv.sim.advance(1)
        await lv.settle()
    assert not lv.pods(h, live=False) and not _exists(lv, JOBSETS, name) and not _exists(lv, TRAINJOBS, name)
    assert isinstance(await backend.observe(h), Absent)
    assert _deletes(lv, "stopper") == 1
    for _ in range(20):  # and nothing comes back
        lv.sim.advance(1)
        await lv.settle()
    assert not lv.pods(h, live=False)


async def test_cancel_ends_with_every_pod_gone_and_says_so_only_then(lv: Live) -> None:
    clock = ManualClock()
    cluster = Cluster(await lv.open(), MemoryStore(clock), clock=clock)
    rec = await cluster.submit(job(nodes=2), job_id="cancel-me")
    assert rec.handle is not None
    h = rec.handle
    await lv.until(lambda: len(lv.pods(h)) == 2, "running")
    rec = await cluster.cancel("cancel-me")
    history = [(t.what, t.why) for t in await cluster.history("cancel-me")]
    assert rec.state is State.STOPPING, ("pods remain: not cancelled yet", history)
    while True:
        rec = await cluster.get("cancel-me")
        if rec.state is State.CANCELLED:
            break
        assert lv.pods(h, live=False) or _exists(lv, JOBSETS, h.ref.split("/", 1)[1])
        await cluster.cancel("cancel-me")  # asked again, as an impatient user does
        lv.sim.advance(1)
        clock.advance(1)
        await lv.settle()
    assert not lv.pods(h, live=False)
    assert _deletes(lv, "cancel-me") == 1


REQUEUE = Rule(Action.REQUEUE, max=2, backoff=5.0)


async def test_a_supervised_requeue_starts_the_next_incarnation_only_once_every_pod_is_gone(lv: Live) -> None:
    clock = ManualClock()
    policy = Policy({Cause.EXIT_CODE: REQUEUE, Cause.UNKNOWN: REQUEUE})
    cluster = Cluster(await lv.open(), MemoryStore(clock), clock=clock, policy=policy)
    # Node 0 fails the first incarnation while node 1 still runs: the requeue must stop node 1 first.
    script = "env:DISPATCH_EPOCH=1.0: sleep 3; env:DISPATCH_EPOCH=1.0: exit 3; sleep 3; exit 0"
    await cluster.submit(job(script, nodes=2), job_id="requeued")
    first = (await cluster.store.get("requeued")).handle
    assert first is not None
    sup = cluster.supervisor(poll=1.0, lease=30.0)
    for _ in range(300):
        await sup.step()
        rec = await cluster.store.get("requeued")
        if rec.state is State.SUCCEEDED:
            break
        lv.sim.advance(1)
        clock.advance(1)
        await lv.settle()
    history = await cluster.history("requeued")
    assert (rec.state, rec.epoch) == (State.SUCCEEDED, Epoch(2, 1)), [t.what for t in history]
    ceased = next(t for t in history if t.what == "ceased")
    started = [t for t in history if t.what == "started"][1]
    assert ceased.at <= started.at
    assert not lv.pods(first, live=False)
    assert _deletes(lv, "requeued") <= 2, (
        "one DELETE per incarnation (the finished second one may be removed too)"
    )


async def test_under_kueue_stop_deactivates_the_workload_instead_of_suspending(lv: Live) -> None:
    """Kueue owns ``spec.suspend`` of the jobs it queues: the pods are made to go by deactivating the
    Workload (Kueue then evicts it), never by suspending the TrainJob behind its back."""
    backend = await lv.open(queue="user-queue")
    h = await place(backend, job(nodes=2), ident("kueued"))
    await lv.until(lambda: len(lv.pods(h)) == 2, "admitted and running")
    await backend.stop(h)
    deactivated = [r for r in lv.sim.requests.filter(verb="patch", resource="workloads")]
    assert len(deactivated) == 1
    assert not [r for r in lv.sim.requests.filter(verb="patch", resource="trainjobs") if "/kueued-" in r.path]
    while not await backend.ceased(h):
        obs = await backend.observe(h)
        if isinstance(obs, Observation):
            assert obs.compute is Compute.GONE or not obs.outcome.terminal, obs
        await backend.stop(h)
        lv.sim.advance(1)
        await lv.settle()
    assert not lv.pods(h, live=False)
    assert isinstance(await backend.observe(h), Absent)
    assert _deletes(lv, "kueued") == 1
