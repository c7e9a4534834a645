"""One reading path (SPEC §9.6) over real HTTP on kubesim: every reader of a process shares one list+watch
per kind; ``Cluster.watch(job_id)`` follows the shared feed and sees a deletion by another tool."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from kubeflow_fixtures import caught_up, config, ident, install, kubeconfig, spec, torch_runtime, variant
from kubeflow_live import Live, job, live

import dispatch
from dispatch import Cause, JobRecord, State
from dispatch.backend import place
from dispatch_kubeflow.backend import open_backend
from kubesim.resources import TRAINJOBS
from kubesim.sim import Simulator


@pytest_asyncio.fixture
async def lv(tmp_path: Path) -> AsyncIterator[Live]:
    async for x in live(tmp_path):
        yield x


async def _follow(cluster: dispatch.Cluster, job_id: str, seen: list[JobRecord]) -> None:
    async for rec in cluster.watch(job_id):
        seen.append(rec)


async def test_a_background_deletion_by_another_tool_is_stopping_then_failed_cancelled_by_others(
    lv: Live,
) -> None:
    """Another tool deletes a running job's TrainJob (kubectl's default, Background propagation: the
    TrainJob goes at once, its pods terminate after it). The job's watch says ``stopping`` while they do —
    never ``cancelled``, never ``lost`` — then ``failed``/``cancelled``, its evidence saying dispatch did not
    ask for the stop."""
    backend = await lv.open()
    cluster = dispatch.Cluster(backend, dispatch.MemoryStore())
    rec = await cluster.submit(job(), job_id="deleted-elsewhere")
    assert rec.handle is not None
    records = cluster.watch(rec.job_id)
    first = await anext(records)
    assert not first.outcome.terminal, first.outcome
    lv.sim.store.delete(TRAINJOBS, "default", rec.handle.ref.partition("/")[2], propagation="Background")
    seen: list[JobRecord] = []

    async def follow() -> None:
        async for r in records:
            seen.append(r)

    following = asyncio.ensure_future(follow())
    try:
        await lv.until(following.done, "the watch of the job reports the deletion to its end")
    finally:
        following.cancel()
        with contextlib.suppress(BaseException):
            await following
        await records.aclose()
    states = [r.state for r in seen]
    assert State.STOPPING in states and State.LOST not in states and State.CANCELLED not in states, states
    last = seen[-1]
    assert (last.state, last.outcome.cause) == (State.FAILED, Cause.CANCELLED), last.outcome
    assert "StoppedByOthers" in [e.reason for e in last.outcome.evidence]
    assert (await cluster.get(rec.job_id)).state is State.FAILED


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
    n = lv.sim.requests.total - before
    sent = list(lv.sim.requests)[-n:] if n else []
    streams = [r for r in sent if r.verb in ("list", "watch")]
    assert not streams, (
        f"a watch of one job opened its own list/watch: {[(r.verb, r.resource) for r in streams]}"
    )
    # each watch(job_id) reads its job from the shared cache: no request at all
    assert sent == [], [(r.verb, r.path) for r in sent]


async def test_cluster_identity_is_read_from_the_cluster_and_fills_every_handle(lv: Live) -> None:
    from kubesim.resources import NAMESPACES

    writable = await lv.open()
    read_only = await lv.open(read_only=True)
    uid = lv.sim.store.get(NAMESPACES, None, "kube-system")["metadata"]["uid"]
    assert writable.cluster_id == read_only.cluster_id == f"kubernetes:{uid}"
    handle = await place(writable, job(), ident("with-cluster"))
    assert handle.cluster == writable.cluster_id
    await caught_up(read_only, lv.sim)
    assert (await read_only.observe(handle)).handle.cluster == writable.cluster_id
    assert [o.handle.cluster for o in await read_only.list()] == [writable.cluster_id]
    async with Simulator() as other:
        elsewhere = await open_backend(
            config(
                {"kubeconfig": kubeconfig(Path(lv.kc).with_name("other"), other.url, other.token("admin"))}
            ),
            probe_window=0.1,
        )
        try:
            assert elsewhere.cluster_id != writable.cluster_id
        finally:
            await elsewhere.close()


async def test_two_stores_on_one_cluster_never_see_each_others_objects(lv: Live) -> None:
    from dispatch import ConflictError
    from dispatch_kubeflow.names import LABEL_STORE

    mine = await lv.open(store_id="store-a")
    theirs = await lv.open(store_id="store-b")
    handle = await place(mine, job(), ident("store-a-job"))
    await lv.until(lambda: bool(lv.pods(handle)), "its pod")
    assert lv.pods(handle)[0]["metadata"]["labels"][LABEL_STORE] == "store-a"
    await caught_up(mine, lv.sim)
    await caught_up(theirs, lv.sim)
    assert [o.handle for o in await mine.list()] == [handle]
    assert await theirs.list() == []
    with pytest.raises(ConflictError, match="store 'store-a'"):
        await place(theirs, job(), ident("store-a-job"))  # the identity lookup refuses to adopt it


# --- what outlives the pods (SPEC §7): a fresh process reads a failure whose pods are gone -------------


async def _fails_and_its_pods_go(lv: Live, script: str, job_id: str) -> dispatch.Handle:
    first = await lv.open()
    handle = await place(first, job(script), ident(job_id))
    await lv.until(lambda: bool(lv.pods(handle)), "its pod")
    await lv.until(
        lambda: _failed(lv, handle) and not lv.pods(handle, live=False),
        "the TrainJob failed and its pods are gone",
    )
    await first.close()
    return handle


def _failed(lv: Live, handle: dispatch.Handle) -> bool:
    tj = lv.sim.store.get(TRAINJOBS, "default", handle.ref.partition("/")[2])
    return any(
        c.get("type") == "Failed" and c.get("status") == "True" for c in tj["status"].get("conditions", [])
    )


async def test_a_fresh_process_reads_a_preemption_whose_pods_are_gone_from_the_events(lv: Live) -> None:
    handle = await _fails_and_its_pods_go(lv, "sleep 2; preempt", "preempted-gone")
    fresh = await lv.open()
    obs = await fresh.observe(handle)
    assert (obs.state, obs.cause) == (State.FAILED, Cause.PREEMPTED), obs.outcome
    assert (obs.outcome.evidence[0].kind, obs.outcome.evidence[0].reason) == ("Pod", "Preempted")


async def test_a_fresh_process_reads_a_node_loss_whose_pods_are_gone_from_the_events(lv: Live) -> None:
    handle = await _fails_and_its_pods_go(lv, "sleep 2; lose-node", "node-lost-gone")
    fresh = await lv.open()
    obs = await fresh.observe(handle)
    assert (obs.state, obs.cause) == (State.FAILED, Cause.NODE_LOST), obs.outcome
    assert obs.outcome.evidence[0].reason in ("TaintManagerEviction", "NodeNotReady")


async def test_a_supervisor_started_after_a_preemption_whose_pods_are_gone_requeues_it(lv: Live) -> None:
    """The repro of issue 19: submit examples/preempted.yaml, wait, `dispatch supervise --once` — it said
    failed/unknown and never requeued. A supervisor started late, in a fresh process, requeues it."""
    from dispatch import Epoch, ManualClock
    from dispatch.cluster import Cluster
    from dispatch.records import MemoryStore

    clock = ManualClock()
    store = MemoryStore(clock)
    submitting = Cluster(await lv.open(), store, clock=clock)
    script = "env:DISPATCH_EPOCH=1.0: sleep 2; env:DISPATCH_EPOCH=1.0: preempt; sleep 2; exit 0"
    rec = await submitting.submit(job(script), job_id="preempted-late")
    assert rec.handle is not None
    handle = rec.handle
    await lv.until(lambda: bool(lv.pods(handle)), "its pod")
    await lv.until(lambda: _failed(lv, handle) and not lv.pods(handle, live=False), "failed, pods gone")
    late = Cluster(await lv.open(), store, clock=clock)  # a fresh process: nothing of the first one's memory
    sup = late.supervisor(poll=1.0, lease=30.0)
    for _ in range(120):
        await sup.step()
        rec = await store.get("preempted-late")
        if rec.epoch.n == 2:
            break
        await lv.settle()
        lv.sim.advance(1)
        clock.advance(1)
    history = await late.history("preempted-late")
    assert rec.epoch == Epoch(2, 1), [(t.what, str(t.state), t.why) for t in history]
    assert any(t.state is State.FAILED and t.cause is Cause.PREEMPTED for t in history), [
        (t.what, str(t.state)) for t in history
    ]


async def test_a_fresh_process_reads_the_oom_seen_while_restarting_from_the_record(lv: Live) -> None:
    """OOM-killed and restarted in place until the Job gives up; its controller deletes the pod. The cause a
    first process saw while the container restarted is in the record, so a fresh process reads it."""
    from dispatch import MemoryStore
    from dispatch.cluster import Cluster

    rt = variant(torch_runtime(), "on-failure")
    template = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    template["spec"]["backoffLimit"] = 2
    template["spec"]["template"]["spec"]["restartPolicy"] = "OnFailure"
    install(lv.sim, rt)
    store = MemoryStore()
    first = Cluster(await lv.open(), store)
    spec_ = spec("on-failure", env={"KUBESIM_SCRIPT": "print loading; sleep 5; oom"})
    rec = await first.submit(spec_, job_id="oom-restarts")
    assert rec.handle is not None
    handle = rec.handle
    seen: list[str] = []

    def restarting() -> bool:
        return any(
            c.get("restartCount", 0) > 0
            for p in lv.pods(handle)
            for c in p.get("status", {}).get("containerStatuses", [])
        )

    await lv.until(restarting, "the container restarted in place")
    await caught_up(first.backend, lv.sim)
    seen.append(str((await first.get("oom-restarts")).outcome))
    assert seen[-1] == "running (out_of_memory)", seen
    await lv.until(lambda: _failed(lv, handle) and not lv.pods(handle, live=False), "failed, pods gone")
    fresh = Cluster(await lv.open(), store)
    got = await fresh.get("oom-restarts")
    assert (got.state, got.outcome.cause) == (State.FAILED, Cause.OUT_OF_MEMORY), got.outcome
