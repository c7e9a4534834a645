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
