"""The host owns the truth, on Kubeflow over real HTTP to kubesim (issue 35's repros): a record is
terminal only once the compute is gone, whichever process reads it; a terminal record never sits over live
compute; who stopped a job is said; a reused job id never binds an old object; every transition a writer
makes is in the history."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from kubeflow_fixtures import caught_up, ident
from kubeflow_live import Live, job, live

from dispatch import Actor, Cause, Compute, Handle, JobRecord, ManualClock, Observation, State
from dispatch.backend import place
from dispatch.cluster import Cluster
from dispatch.decide import STOP_GRACE
from dispatch.records import MemoryStore, SqliteStore
from dispatch.supervise import Supervisor
from dispatch_kubeflow.backend import Backend
from dispatch_kubeflow.naming import identity_labels
from kubesim.clock import unstamp
from kubesim.controllers.job import SYNC_JOB_BATCH_PERIOD
from kubesim.resources import JOBS, TRAINJOBS


@pytest.fixture
async def lv(tmp_path: Path) -> AsyncIterator[Live]:
    async for x in live(tmp_path):
        yield x


async def _tick(lv: Live, clock: ManualClock, seconds: float, *sups: Supervisor) -> None:
    """Move the cluster's and the records' time together, letting each supervisor step."""
    lv.sim.advance(seconds)
    clock.advance(seconds)
    await lv.settle()
    for sup in sups:
        await sup.step()


async def test_a_cancel_is_stopping_for_every_process_until_the_pods_have_terminated(lv: Live) -> None:
    """Cancelled under a supervisor, with the pods' 30 s termination grace: ``stopping`` for those 30 s —
    read by the process that cancelled, by the supervisor, and by a third that only reads — then
    ``cancelled``; never a false ``held`` on the way (the stop suspends first)."""
    clock = ManualClock()
    store = MemoryStore(clock)
    user = Cluster(await lv.open(), store, clock=clock)
    sup = Cluster(await lv.open(), store, clock=clock).supervisor(poll=1.0, lease=30.0)
    reader = Cluster(await lv.open(read_only=True), store, clock=clock)
    rec = await user.submit(job(nodes=2), job_id="cancel-grace")
    assert rec.handle is not None
    while len([p for p in lv.pods(rec.handle) if p["status"].get("phase") == "Running"]) < 2:
        await _tick(lv, clock, 1.0, sup)
    assert (await user.cancel("cancel-grace")).state is State.STOPPING
    stopping_for = 0.0
    while lv.pods(rec.handle, live=False):
        for who in (user, reader):
            await caught_up(who.backend, lv.sim)
            got = await who.get("cancel-grace")
            assert got.state is State.STOPPING, (who, got.outcome)
        await _tick(lv, clock, 5.0, sup)
        stopping_for += 5.0
    assert stopping_for >= 25.0, "the pods went before their grace period: kubesim is kinder than a kubelet"
    for who in (user, reader):
        await caught_up(who.backend, lv.sim)
        done = await who.get("cancel-grace")
        assert (done.state, done.outcome.cause) == (State.CANCELLED, Cause.CANCELLED)
    states = [t.state for t in await user.history("cancel-grace") if t.state is not None]
    assert State.HELD not in states and states[-2:] == [State.STOPPING, State.CANCELLED], states
    await sup.close()


async def test_a_foreground_deletion_by_someone_else_that_loops_is_stopped_by_the_supervisor(
    lv: Live,
) -> None:
    """Someone deletes a running job's TrainJob with ``--cascade=foreground``: the Trainer of the field
    re-creates its JobSet while the deletion waits on it (pods keep coming back). The record says
    ``stopping`` (cancelled, and not by dispatch); past the stop grace the supervisor stops what remains,
    the loop ends, and the record ends ``failed``/``cancelled`` saying dispatch did not ask for it."""
    clock = ManualClock()
    cluster = Cluster(await lv.open(), MemoryStore(clock), clock=clock)
    sup = cluster.supervisor(poll=1.0, lease=30.0)
    rec = await cluster.submit(job(), job_id="foreground")
    assert rec.handle is not None
    while not lv.pods(rec.handle):
        await _tick(lv, clock, 1.0, sup)
    name = rec.handle.ref.split("/", 1)[1]
    lv.sim.store.delete(TRAINJOBS, "default", name, propagation="Foreground")
    waited = 0.0
    while True:
        await _tick(lv, clock, 5.0, sup)
        waited += 5.0
        got = await cluster.store.get("foreground")
        if got.outcome.terminal:
            break
        assert waited < STOP_GRACE + 300, f"still {got.outcome} after {waited:g} s"
        if waited < STOP_GRACE:
            assert got.state is State.STOPPING, got.outcome
    assert waited >= STOP_GRACE, "ended before the supervisor stopped the loop: kubesim did not re-create"
    assert (got.state, got.outcome.cause) == (State.FAILED, Cause.CANCELLED)
    assert "StoppedByOthers" in [e.reason for e in got.outcome.evidence]
    history = await cluster.history("foreground")
    assert [t for t in history if t.actor is Actor.SUPERVISOR and t.what == "stopping what remains"]
    for _ in range(10):  # nothing comes back
        await _tick(lv, clock, 5.0, sup)
    assert not lv.pods(rec.handle, live=False)
    await sup.close()


async def test_dispatch_cancel_stops_a_foreground_deletion_that_loops_with_no_supervisor(lv: Live) -> None:
    """The same loop with no supervisor running: the record says ``stopping`` (it once read ``lost``, and
    ``dispatch cancel`` refused: "it already ended"); the user's cancel stops what remains, the loop ends
    and the record ends with no pod left."""
    clock = ManualClock()
    cluster = Cluster(await lv.open(), MemoryStore(clock), clock=clock)
    rec = await cluster.submit(job(), job_id="foreground-cancel")
    assert rec.handle is not None
    while not lv.pods(rec.handle):
        await _tick(lv, clock, 1.0)
    name = rec.handle.ref.split("/", 1)[1]
    lv.sim.store.delete(TRAINJOBS, "default", name, propagation="Foreground")
    for _ in range(6):  # the Trainer re-creates the JobSet while the deletion waits on it
        await _tick(lv, clock, 5.0)
        await caught_up(cluster.backend, lv.sim)
        assert (await cluster.get("foreground-cancel")).state is State.STOPPING
    assert lv.pods(rec.handle, live=False), "the loop ended by itself: kubesim did not re-create the JobSet"
    await cluster.cancel("foreground-cancel")
    waited = 0.0
    while True:
        await _tick(lv, clock, 5.0)
        await caught_up(cluster.backend, lv.sim)
        got = await cluster.get("foreground-cancel")
        if got.outcome.terminal:
            break
        waited += 5.0
        assert waited < 600, got.outcome
    assert got.outcome.cause is Cause.CANCELLED, got.outcome
    for _ in range(10):  # nothing comes back
        await _tick(lv, clock, 5.0)
    assert not lv.pods(rec.handle, live=False)


async def test_a_config_error_given_up_leaves_no_pod(lv: Live) -> None:
    """A job whose pods cannot be created (a missing Secret) fails ``config_error`` once its grace is past —
    but its pods still hold their nodes: the record is ``stopping`` until the supervisor stops them, then
    ``failed``/``config_error``, given up, with no pod left."""
    clock = ManualClock()
    cluster = Cluster(await lv.open(), MemoryStore(clock), clock=clock)
    sup = cluster.supervisor(poll=1.0, lease=30.0)
    rec = await cluster.submit(job("config-error db-password; print never"), job_id="no-secret")
    assert rec.handle is not None
    waited = 0.0
    while True:
        await _tick(lv, clock, 15.0, sup)
        waited += 15.0
        got = await cluster.store.get("no-secret")
        if got.outcome.terminal and got.plan is not None:
            break
        assert waited < 3600, got.outcome
    assert (got.state, got.outcome.cause) == (State.FAILED, Cause.CONFIG_ERROR)
    whats = [t.what for t in await cluster.history("no-secret")]
    assert "stopping" in whats and "stopping what remains" in whats and "gave up" in whats, whats
    assert not lv.pods(rec.handle, live=False)
    await sup.close()


async def test_every_job_has_its_started_line_while_a_watcher_folds_beside_the_submits(lv: Live) -> None:
    """With a watcher (``dispatch list -w``) folding every change while jobs are submitted, each job's
    history still names the incarnation placed (its ``started`` line): whoever folds first writes it."""
    for run in range(20):
        store = MemoryStore()
        watcher = Cluster(await lv.open(), store)
        submitter = Cluster(await lv.open(), store)
        seen: list[str] = []

        async def follow(w: Cluster = watcher, into: list[str] = seen) -> None:
            async for r in w.watch():
                into.append(r.job_id)

        task = asyncio.ensure_future(follow())
        try:
            ids = [f"race-{run}-{i}" for i in range(6)]
            await asyncio.gather(*(submitter.submit(job(), job_id=j) for j in ids))
            for _ in range(10):
                await lv.settle()
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for j in ids:
            started = [t for t in await store.history(j) if t.what == "started"]
            rec = await store.get(j)
            assert rec.handle is not None and started, (run, j, [t.what for t in await store.history(j)])
            assert str(rec.handle) in started[0].why


@pytest.mark.parametrize("how", ["purged", "another store"])
async def test_a_reused_job_id_never_binds_the_old_object(lv: Live, tmp_path: Path, how: str) -> None:
    """A job id used again — after ``purge``, or by another store on the same cluster — runs its own
    command: its own output and exit code, never the old object's result."""
    first_store = SqliteStore(tmp_path / "a.db")
    first = Cluster(await lv.open(store_id=await _store_id(first_store)), first_store)
    old = await first.submit(job("exit 0"), job_id="reused")
    assert old.handle is not None
    while not (await first.get("reused")).outcome.terminal:
        await lv.settle()
        lv.sim.advance(1.0)
    assert (await first.get("reused")).state is State.SUCCEEDED
    if how == "purged":
        assert await first.purge(older_than=1e12) == 1
        second = first
    else:
        second_store = SqliteStore(tmp_path / "b.db")
        second = Cluster(await lv.open(store_id=await _store_id(second_store)), second_store)
    new = await second.submit(job("print mine; exit 7"), job_id="reused")
    assert new.handle is not None and new.handle.ref != old.handle.ref
    assert new.nonce != old.nonce
    while not (await second.get("reused")).outcome.terminal:
        await lv.settle()
        lv.sim.advance(1.0)
    ended = await second.get("reused")
    assert (ended.state, ended.outcome.cause) == (State.FAILED, Cause.EXIT_CODE), ended.outcome
    assert 7 in [e.exit_code for e in ended.outcome.evidence]
    lines = [line async for line in second.output("reused")]
    assert "mine" in lines


async def _store_id(store: SqliteStore) -> str:
    from dispatch.records import store_identity

    return await store_identity(store)


BLIP = "sleep 5; rank=0: exit 3; hang"  # both nodes run 5 s; then node 0 exits 3 while node 1 runs on


async def _waiting(done: Callable[[], bool], *, tries: int = 2000) -> None:
    """Return once ``done()`` holds, letting other tasks (a watch) run; fail after ``tries`` turns."""
    for _ in range(tries):
        if done():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the watch did not show what get shows")


def _failed_pod(lv: Live, handle: Handle) -> dict[str, Any] | None:
    return next((p for p in lv.pods(handle) if p["status"].get("phase") == "Failed"), None)


async def _observe(lv: Live, backend: Backend, handle: Handle) -> Observation:
    await lv.settle()
    await caught_up(backend, lv.sim)
    got = await backend.observe(handle)
    assert isinstance(got, Observation), got
    return got


async def test_a_failing_node_reads_starting_with_its_cause_for_the_batch_period_then_failed(
    lv: Live,
) -> None:
    """The Job controller syncs a pod that ended a batch period later (upstream's ``SyncJobBatchPeriod``,
    1 s; kubesim does the same): for that second a job whose node 0 exited 3 while node 1 runs has no
    failed Job yet, and the adapter reads ``starting`` with the pod's cause — as on a real cluster —, then
    ``failed``/``exit_code`` once the Job has synced."""
    backend = await lv.open()
    h = await place(backend, job(BLIP, nodes=2), ident("blip"))
    await lv.until(lambda: [p["status"].get("phase") for p in lv.pods(h)] == ["Running"] * 2, "both running")
    assert (await _observe(lv, backend, h)).state is State.RUNNING
    await lv.until(lambda: _failed_pod(lv, h) is not None, "node 0 failed", step=0.5)
    pod = _failed_pod(lv, h)
    assert pod is not None
    (node,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "node"]
    ended = unstamp(lv.sim.clock, node["state"]["terminated"]["finishedAt"])
    assert lv.sim.clock.now() < ended + SYNC_JOB_BATCH_PERIOD
    blip = await _observe(lv, backend, h)
    assert (blip.state, blip.cause, blip.compute) == (State.STARTING, Cause.EXIT_CODE, Compute.PRESENT)
    assert 3 in [e.exit_code for e in blip.outcome.evidence], blip.outcome
    assert not [e for e in blip.outcome.evidence if e.kind == "Job"], "the Job has not synced yet"
    lv.sim.advance(SYNC_JOB_BATCH_PERIOD)
    after = await _observe(lv, backend, h)
    assert (after.state, after.cause) == (State.FAILED, Cause.EXIT_CODE), after.outcome
    assert "BackoffLimitExceeded" in [e.reason for e in after.outcome.evidence if e.kind == "Job"]


async def test_the_record_never_goes_back_to_starting_through_the_blip(lv: Live) -> None:
    """Through the host, the same job: read with ``get`` at each second and followed by a ``watch``, the
    record goes ``running`` → ``running`` with the cause → ``stopping``/``failed`` with it; never
    ``starting`` after ``running``, and its history never shows a state going back."""
    clock = ManualClock()
    store = MemoryStore(clock)
    reader = Cluster(await lv.open(), store, clock=clock)
    follower = Cluster(await lv.open(read_only=True), store, clock=clock)
    rec = await reader.submit(job(BLIP, nodes=2), job_id="blip")
    assert rec.handle is not None
    watched: list[JobRecord] = []

    async def follow() -> None:
        async for r in follower.watch("blip"):
            watched.append(r)

    task = asyncio.ensure_future(follow())
    read: list[tuple[State, Cause]] = []
    try:
        while True:
            await lv.settle()
            await caught_up(reader.backend, lv.sim)
            got = await reader.get("blip")
            now = (got.state, got.outcome.cause)
            if not read or read[-1] != now:
                read.append(now)
            # The watch folds the same cluster through its own stream: it shows the same, in its time.
            await _waiting(
                lambda now=now: bool(watched) and (watched[-1].state, watched[-1].outcome.cause) == now
            )
            if got.outcome.terminal:
                break
            await _tick(lv, clock, 1.0)
            assert len(read) < 100, read
        await _waiting(task.done)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    # Read at each second: the blip (a `starting` reading with the pod's cause) keeps `running`, takes the
    # cause; then the failed Job's remaining pod is stopping, and once it is gone the record is failed.
    after = read[read.index((State.RUNNING, Cause.NONE)) :]
    assert after[:2] == [(State.RUNNING, Cause.NONE), (State.RUNNING, Cause.EXIT_CODE)], read
    assert after[2:] in (
        [(State.STOPPING, Cause.EXIT_CODE), (State.FAILED, Cause.EXIT_CODE)],
        [(State.FAILED, Cause.EXIT_CODE)],
    ), read
    followed = [(r.state, r.outcome.cause) for r in watched]
    assert followed[-1] == (State.FAILED, Cause.EXIT_CODE) and (State.RUNNING, Cause.EXIT_CODE) in followed
    since = [s for s, _ in followed[[s for s, _ in followed].index(State.RUNNING) :]]
    assert State.STARTING not in since and all(b.rank >= a.rank for a, b in itertools.pairwise(since)), (
        followed
    )
    history = [t.state for t in await reader.history("blip") if t.state is not None]
    assert all(b.rank >= a.rank for a, b in itertools.pairwise(history)), history


async def test_a_jobs_failure_read_before_its_pods_oom_keeps_the_oom(lv: Live) -> None:
    """Each kind is its own watch stream, with no order across them: in the fault runs the Job's
    ``BackoffLimitExceeded`` arrived before the pod's ``OOMKilled`` 3 times in 568. Here the pods' watch
    lags until the Job's failure has been read: the record is not terminal on it (its pod is still
    running, as far as anyone has read), and once the pod's end arrives the job failed of running out
    of memory, with the Job's condition beside the pod's reason."""
    clock = ManualClock()
    store = MemoryStore(clock)
    cluster = Cluster(await lv.open(), store, clock=clock)
    rec = await cluster.submit(job("print loading; sleep 5; oom"), job_id="oom-late")
    assert rec.handle is not None
    handle = rec.handle
    await lv.until(lambda: [p["status"].get("phase") for p in lv.pods(handle)] == ["Running"], "running")
    await caught_up(cluster.backend, lv.sim)
    assert (await cluster.get("oom-late")).state is State.RUNNING
    lv.sim.faults.lag_watches(r"/pods$")
    try:
        await lv.until(lambda: _job_failed(lv, handle), "the Job failed", step=0.5)
        await caught_up(cluster.backend, lv.sim, but=("pods",))
        early = await cluster.get("oom-late")
        # The Job's failure is read; its pod still runs as far as anyone has read: stopping.
        assert early.state is State.STOPPING, early.outcome
        assert early.outcome.cause is not Cause.OUT_OF_MEMORY, "the pod's end was read: the watch did not lag"
    finally:
        lv.sim.faults.catch_up()
    await caught_up(cluster.backend, lv.sim)
    done = await cluster.get("oom-late")
    assert (done.state, done.outcome.cause) == (State.FAILED, Cause.OUT_OF_MEMORY), done.outcome
    reasons = {(e.kind, e.reason) for e in done.outcome.evidence}
    assert {("Pod", "OOMKilled"), ("Job", "BackoffLimitExceeded")} <= reasons, reasons
    states = [t.state for t in await cluster.history("oom-late") if t.state is not None]
    assert all(b.rank >= a.rank for a, b in itertools.pairwise(states)), states


def _job_failed(lv: Live, handle: Handle) -> bool:
    selector = ",".join(f"{k}={v}" for k, v in identity_labels(handle.identity).items())
    jobs = lv.sim.store.list(JOBS, "default", label_selector=selector)[0]
    return any(
        c.get("type") == "Failed" and c.get("status") == "True"
        for j in jobs
        for c in j.get("status", {}).get("conditions", [])
    )
