"""Cessation and output of the kubeflow adapter over real HTTP on kubesim: ``ceased`` only once the TrainJob,
JobSet and every pod are gone; ``PodsRemainError`` names what remains; a deletion that never completes is
reported as such; node output by rank, ``follow`` waiting for a pending pod, ``previous``; the output tail of
a failed node in the outcome's evidence."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from kubeflow_fixtures import config, ident, install, torch_runtime, variant
from kubeflow_live import Collector, Live, job, live

from dispatch import BusyError, Cause, InvalidError, NotFoundError, State
from dispatch.backend import place
from dispatch.clock import ManualClock
from dispatch_kubeflow import PodsRemainError
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.incarnation import STUCK_AFTER
from kubesim.errors import ApiError
from kubesim.resources import JOBSETS, TRAINJOBS


@pytest_asyncio.fixture
async def lv(tmp_path: Path) -> AsyncIterator[Live]:
    async for x in live(tmp_path):
        yield x


def _exists(lv: Live, rt: object, name: str) -> bool:
    try:
        lv.sim.store.get(rt, "default", name)  # type: ignore[arg-type]
    except ApiError:
        return False
    return True


def _name(handle: object) -> str:
    return handle.ref.split("/", 1)[1]  # type: ignore[attr-defined]


async def test_ceased_only_when_trainjob_jobset_and_every_pod_are_gone(lv: Live) -> None:
    backend = await lv.open()
    h = await place(backend, job(nodes=2), ident("cease"))
    await lv.until(
        lambda: len(lv.pods(h)) == 2 and all(p["status"]["phase"] == "Running" for p in lv.pods(h)), "running"
    )
    assert not await backend.ceased(h)
    with pytest.raises(PodsRemainError) as caught:
        await backend.require_ceased(h)
    assert "(running)" in str(caught.value) and 'TrainJob "' in str(caught.value)
    await backend.stop(h)
    with pytest.raises(PodsRemainError) as caught:
        await backend.require_ceased(h)
    message = str(caught.value)
    for pod in lv.pods(h, live=False):
        assert f'pod "{pod["metadata"]["name"]}" (terminating since ' in message, message
    waiter = asyncio.ensure_future(backend.wait_ceased(h))
    try:
        await lv.until(
            lambda: not lv.pods(h, live=False) and not _exists(lv, JOBSETS, _name(h)),
            "the pods and JobSet gone",
        )
        await lv.until(lambda: not _exists(lv, TRAINJOBS, _name(h)), "the TrainJob gone")
        async with asyncio.timeout(5):
            await waiter
    finally:
        waiter.cancel()
    assert await backend.ceased(h)
    await backend.require_ceased(h)


async def test_a_deletion_that_never_completes_is_reported_not_called_done(lv: Live) -> None:
    """A finalizer nobody removes keeps the TrainJob: it never reads as ceased, and once the deletion has
    been seen unfinished for a while the error and the evidence say so and how to fix it."""
    writer = await lv.open()
    h = await place(writer, job(), ident("stuck"))
    await lv.until(lambda: bool(lv.pods(h)), "a pod")
    lv.sim.store.mutate(
        TRAINJOBS,
        "default",
        _name(h),
        lambda o: o["metadata"].setdefault("finalizers", []).append("example.com/keep"),
    )
    await writer.stop(h)
    await lv.until(lambda: not lv.pods(h, live=False), "the pods gone")
    clock = ManualClock()
    reader = await open_backend(config({"kubeconfig": lv.kc}, read_only=True), clock=clock)
    lv.opened.append(reader)
    assert not await reader.ceased(h)
    with pytest.raises(PodsRemainError) as first:
        await reader.require_ceased(h)
    assert "example.com/keep" in str(first.value) and "has not completed" not in str(first.value)
    clock.advance(STUCK_AFTER + 1)
    with pytest.raises(PodsRemainError) as later:
        await reader.require_ceased(h)
    assert "has not completed in" in str(later.value) and "finalizers" in str(later.value), later.value
    obs = await reader.observe(h)
    stuck = [e for e in obs.outcome.evidence if e.reason == "DeletionStuck"]
    assert stuck and "example.com/keep" in stuck[0].message, obs.outcome
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.3):
            await reader.wait_ceased(h)


async def test_the_output_tail_of_a_failed_node_is_evidence(lv: Live) -> None:
    backend = await lv.open(outputTailLines=3)
    script = "print line one; print line two; print line three; print line four; exit 3"
    h = await place(backend, job(script, nodes=2), ident("tail"))
    watch = Collector(backend.watch())
    try:
        await lv.until(lambda: watch.last(h) is State.FAILED, "failed")
    finally:
        await watch.close()
    last = watch.of(h)[-1].observation
    assert last is not None
    outcome = last.outcome
    assert outcome.cause is Cause.EXIT_CODE
    tails = [e for e in outcome.evidence if e.kind == "Pod" and e.output]
    assert tails, outcome.evidence
    assert tails[0].output == ("line two", "line three", "line four")
    logs = [r for r in lv.sim.requests.filter(resource="pods/log") if not r.name.startswith("dispatch-probe")]
    assert 1 <= len(logs) <= 2 and all(r.query_dict().get("tailLines") == "3" for r in logs)
    # observe (another process) reads the same evidence while the pods are there
    other = await lv.open(outputTailLines=3)
    observed = await other.observe(h)
    assert any(e.output == tails[0].output for e in observed.outcome.evidence), observed.outcome


async def test_output_reads_node_i_and_follow_waits_for_a_pending_pod(lv: Live) -> None:
    backend = await lv.open()
    h = await place(backend, job("print hello from {rank}; hang", nodes=2), ident("out"), held=True)
    with pytest.raises(NotFoundError):
        _ = [line async for line in backend.output(h, node=1)]
    with pytest.raises(InvalidError):
        _ = [line async for line in backend.output(h, node=2, follow=True)]
    lines: list[str] = []

    async def follow() -> None:
        async for line in backend.output(h, node=1, follow=True):
            lines.append(line)

    task = asyncio.ensure_future(follow())
    try:
        for _ in range(5):
            lv.sim.advance(5)
            await lv.settle()
        assert not task.done() and lines == [], "follow did not wait for the held job's pod"
        lv.sim.store.mutate(TRAINJOBS, "default", _name(h), lambda o: o["spec"].update(suspend=False))
        await lv.until(lambda: lines == ["hello from 1"], "the followed line")
        for pod in lv.pods(h):
            lv.sim.actions.exit("default", pod["metadata"]["name"], 0)
        await lv.until(task.done, "follow to end")
        await task
    finally:
        task.cancel()
    assert [line async for line in backend.output(h, node=0)] == ["hello from 0"]


async def test_previous_reads_the_last_run_of_a_pod_restarting_in_place(lv: Live) -> None:
    rt = variant(torch_runtime(), "restarts")
    rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "restartPolicy"
    ] = "OnFailure"
    install(lv.sim, rt)
    backend = await lv.open()
    from kubeflow_fixtures import spec

    h = await place(backend, spec("restarts", env={"KUBESIM_SCRIPT": "print run; exit 1"}), ident("prev"))
    await lv.until(
        lambda: any(
            cs.get("restartCount", 0) >= 1
            for p in lv.pods(h)
            for cs in p.get("status", {}).get("containerStatuses", [])
        ),
        "a restart",
    )
    assert [line async for line in backend.output(h, previous=True)] == ["run"]
    fresh = await place(backend, job(), ident("prev-none"))
    await lv.until(
        lambda: bool(lv.pods(fresh)) and lv.pods(fresh)[0]["status"].get("phase") == "Running", "running"
    )
    with pytest.raises((BusyError, InvalidError)):
        _ = [line async for line in backend.output(fresh, previous=True)]
