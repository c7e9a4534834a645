"""The supervisor on the Kubeflow adapter against kubesim: the same code as on ``memory``, through the
backend protocols alone. A TrainJob that fails on its first incarnation is requeued once (new TrainJob,
epoch 2.1, once the first one's pods are gone) and succeeds.

(A scripted ``preempt`` is not used here: on kubesim the JobSet restarts preempted pods by itself, so the
adapter reports the incarnation starting again, not failed — nothing for a recovery policy to do.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from kubeflow_fixtures import config, kubeconfig, spec

from dispatch import Action, Cause, Epoch, ManualClock, Policy, Rule, State
from dispatch.cluster import Cluster
from dispatch.records import MemoryStore
from dispatch_kubeflow import Backend
from dispatch_kubeflow.backend import open_backend
from kubesim.sim import Simulator

pytestmark = pytest.mark.asyncio(loop_scope="module")

REQUEUE = Rule(Action.REQUEUE, max=2, backoff=5.0)
# The adapter reads a failed Job's cause from its pods when they are still there, else from the TrainJob.
POLICY = Policy({Cause.EXIT_CODE: REQUEUE, Cause.UNKNOWN: REQUEUE})


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend(sim: Simulator, tmp_path_factory: Any) -> AsyncIterator[Backend]:
    kc = kubeconfig(tmp_path_factory.mktemp("kc") / "config", sim.url, sim.token("admin"))
    b = await open_backend(config({"kubeconfig": kc}), probe_window=0.3)
    yield b
    await b.close()


async def test_a_failed_trainjob_is_requeued_once_and_succeeds(backend: Backend, sim: Simulator) -> None:
    clock = ManualClock()
    cluster = Cluster(backend, MemoryStore(clock), clock=clock, policy=POLICY)
    script = "env:DISPATCH_EPOCH=1.0: sleep 5; env:DISPATCH_EPOCH=1.0: exit 3; sleep 5; exit 0"
    await cluster.submit(spec(nodes=2, env={"KUBESIM_SCRIPT": script}), job_id="sup-fail")
    sup = cluster.supervisor(poll=1.0, lease=30.0)
    for _ in range(150):
        await sup.step()
        rec = await cluster.store.get("sup-fail")
        if rec.state is State.SUCCEEDED:
            break
        await sim.settle()
        sim.advance(2)
        clock.advance(2)
    rec = await cluster.store.get("sup-fail")
    history = await cluster.history("sup-fail")
    assert (rec.state, rec.epoch) == (State.SUCCEEDED, Epoch(2, 1)), [t.what for t in history]
    assert [t.epoch for t in history if t.what == "requeued"] == [Epoch(2, 1)]
    assert any(t.state is State.FAILED and t.epoch == Epoch(1, 0) for t in history)
    assert [t.epoch for t in history if t.what == "started"] == [Epoch(1, 0), Epoch(2, 1)]
    # The adapter has no cessation signal yet: the new TrainJob was created only once the old one (deleted
    # with foreground propagation, so after its pods) was gone from the listing.
    ceased = next(t for t in history if t.what == "ceased")
    started = [t for t in history if t.what == "started"][1]
    assert ceased.at <= started.at


async def test_metrics_scraped_over_http_agree_with_the_records(backend: Backend, sim: Simulator) -> None:
    import asyncio
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from dispatch import Actor, metrics

    def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        return {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    recorder = metrics.enable("127.0.0.1:0")
    try:
        port = metrics.served_port()
        assert port is not None
        clock = ManualClock()
        cluster = Cluster(backend, MemoryStore(clock), clock=clock, policy=POLICY)
        flaky = "env:DISPATCH_EPOCH=1.0: sleep 5; env:DISPATCH_EPOCH=1.0: exit 3; sleep 5; exit 0"
        await cluster.submit(spec(nodes=2, env={"KUBESIM_SCRIPT": flaky}), job_id="met-flaky")
        await cluster.submit(spec(env={"KUBESIM_SCRIPT": "sleep 5; exit 0"}), job_id="met-ok")
        # resync 2 s: every step lists the store, so the counts by state are as of that step (they are
        # as of the last resync, docs/operations.md).
        sup = cluster.supervisor(poll=1.0, lease=30.0, resync=2.0)
        midway: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        for i in range(150):
            await sup.step()
            if i == 3:
                midway = await asyncio.to_thread(scrape, port)  # scraped while the supervisor runs
            records = await cluster.store.list()
            if all(r.state is State.SUCCEEDED for r in records):
                break
            await sim.settle()
            sim.advance(2)
            clock.advance(2)
        clock.advance(2)
        await sup.step()  # a step that resyncs after both are final, and counts the jobs by state
        final = await asyncio.to_thread(scrape, port)
    finally:
        metrics.disable()
    assert midway, "the endpoint answered during the run"
    assert recorder is not None
    records = await cluster.store.list()
    histories = {r.job_id: await cluster.history(r.job_id) for r in records}
    requeues = sum(1 for h in histories.values() for t in h if t.what == "requeued")
    assert requeues == 1, "\n".join(
        f"{k} {t.what} {t.epoch} {t.why[:100]}" for k, h in histories.items() for t in h
    )
    # Requeues by cause, as the history tells them: the cause of the failure each requeue followed.
    expected: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for h in histories.values():
        last_cause = None
        for t in h:
            if t.state is not None and t.state.terminal:
                last_cause = t.cause
            if t.what == "requeued":
                assert last_cause is not None
                key = ("dispatch_requeues_total", (("cause", last_cause.value), ("rule", last_cause.value)))
                expected[key] = expected.get(key, 0.0) + 1
    counted = {k: v for k, v in final.items() if k[0] == "dispatch_requeues_total"}
    assert counted == expected, counted
    started_by_supervisor = sum(
        1 for h in histories.values() for t in h if t.what == "started" and t.actor is Actor.SUPERVISOR
    )
    assert final[("dispatch_incarnations_started_total", ())] == started_by_supervisor == 1
    assert final[("dispatch_outcomes_total", (("cause", "none"), ("state", "succeeded")))] == 2
    assert final[("dispatch_jobs", (("state", "succeeded"),))] == 2
    assert final[("dispatch_jobs", (("state", "running"),))] == 0
    creates = final[
        ("dispatch_api_requests_total", (("resource", "trainjobs"), ("status", "2xx"), ("verb", "create")))
    ]
    assert creates == 3  # two submits and the requeue's new incarnation


async def test_an_idle_supervisor_does_not_relist_a_batch_of_existing_incarnations(
    backend: Backend, sim: Simulator
) -> None:
    """Waiting for a change, the supervisor takes a whole batch from the watch: the Kubeflow watch gives
    every change of its opening listing but the last the cursor from before it, so taking only the first
    change listed every kind and emitted the same batch again, in a hot loop (found by running the
    embedded default's `dispatch run` on a dev cluster that had finished jobs)."""
    import asyncio

    clock = ManualClock()
    cluster = Cluster(backend, MemoryStore(clock), clock=clock, policy=POLICY)
    for i in range(2):  # two incarnations in the namespace besides the ones the tests above left
        await cluster.submit(spec(nodes=1, env={"KUBESIM_SCRIPT": "exit 0"}), job_id=f"idle-{i}")
    await sim.settle()
    sup = cluster.supervisor(jobs={"none-of-these"}, poll=30.0, lease=90.0)  # never due on this clock
    sim.requests.clear()
    stop = asyncio.Event()
    running = asyncio.ensure_future(sup.run(stop=stop))
    await asyncio.sleep(1.0)
    stop.set()
    await asyncio.wait_for(running, 10)
    listings = sim.requests.filter(verb="list", resource="trainjobs")
    # The first step's drain and idle wait each list once; a few more are fine, hundreds are the loop.
    assert len(listings) <= 6, len(listings)


async def test_the_daemon_keeps_one_watch_open_across_its_wake_ups(backend: Backend, sim: Simulator) -> None:
    """``run`` wakes many times (every poll, every change), but opens the watch once: on Kubeflow a
    fresh watch lists every kind again, so reopening it per wake-up would relist the namespace."""
    import asyncio

    cluster = Cluster(backend, MemoryStore(), policy=POLICY)  # the system clock, as the daemon runs
    await cluster.submit(spec(env={"KUBESIM_SCRIPT": "sleep 60; exit 0"}), job_id="sup-one-watch")
    sup = cluster.supervisor(poll=0.05, lease=30.0, resync=3600.0)
    sim.requests.clear()
    steps = 0

    async def count(report: Any) -> None:
        nonlocal steps
        steps += 1

    async def done() -> bool:
        return (await cluster.store.get("sup-one-watch")).state is State.SUCCEEDED

    daemon = asyncio.ensure_future(sup.run(until=done, on_step=count))
    for _ in range(600):  # 60 s of the job's time, 0.5 s each, at least 0.02 s of ours: 50+ polls
        if daemon.done():
            break
        await sim.settle()
        sim.advance(0.5)
        await asyncio.sleep(0.02)
    await asyncio.wait_for(daemon, 30)
    assert await done()
    kinds = len({r.resource for r in sim.requests.filter(verb="watch")})
    watches = sim.requests.filter(verb="watch")
    lists = sim.requests.filter(verb="list")
    assert steps > 4 * kinds  # it woke many times...
    assert len(watches) <= 2 * kinds, [r.resource for r in watches]  # ...and watched each kind once or twice
    assert len(lists) <= 4 * kinds, [r.resource for r in lists]  # the first listing, and the scans' reads
