"""Holds without Kueue over real HTTP (spec.suspend plus the hold annotation), the races a release and a hold
must detect."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from kubeflow_fixtures import caught_up, config, ident, install, kubeconfig, spec, torch_runtime

from dispatch import Observation, State
from dispatch.backend import HoldToken, place
from dispatch.errors import NotFoundError, ReadOnlyError
from dispatch_kubeflow import Backend, StaleHoldError
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.holds import created_token, held_by_us
from dispatch_kubeflow.names import ANNOTATION_HOLD
from kubesim.resources import TRAINJOBS
from kubesim.sim import Simulator

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: Any) -> AsyncIterator[tuple[Simulator, Backend, str]]:
    async with Simulator(install_runtimes=False, kueue=False) as sim:
        install(sim, torch_runtime())
        kc = kubeconfig(tmp_path_factory.mktemp("kc") / "config", sim.url, sim.token("admin"))
        b = await open_backend(config({"kubeconfig": kc}), probe_window=0.1)
        yield sim, b, kc
        await b.close()


def _stored(sim: Simulator, name: str) -> dict[str, Any]:
    return sim.store.get(TRAINJOBS, "default", name)


async def test_hold_suspends_and_annotates_release_undoes_both(env: tuple[Simulator, Backend, str]) -> None:
    sim, b, _ = env
    caps = await b.capabilities()
    assert caps.holds and not caps.queueing
    assert "holds: through spec.suspend and the annotation dispatch.dev/hold" in caps.notes
    h = await place(b, spec(env={"KUBESIM_SCRIPT": "hang"}), ident("nk-1"))
    await sim.settle()
    name = h.ref.split("/")[1]
    token = await b.hold(h)
    assert token.startswith("h-")
    tj = _stored(sim, name)
    assert tj["spec"]["suspend"] is True and tj["metadata"]["annotations"][ANNOTATION_HOLD] == token
    assert await b.hold(h) == token  # idempotent
    await sim.settle()
    obs = await b.observe(h)
    assert obs.state is State.HELD and obs.outcome.evidence[0].reason == "HeldByDispatch"
    await b.release(h, token)
    tj = _stored(sim, name)
    assert tj["spec"]["suspend"] is False and ANNOTATION_HOLD not in tj["metadata"]["annotations"]
    again = await b.hold(h)
    assert again != token  # a fresh token: the old one can never release the new hold
    with pytest.raises(StaleHoldError):
        await b.release(h, token)
    await b.release(h, again)


async def test_a_suspend_by_someone_else_is_queued_with_the_suspension_as_evidence(
    env: tuple[Simulator, Backend, str],
) -> None:
    """SPEC §9.7: held is dispatch's hold alone; a TrainJob someone else suspended waits (queued), the
    suspension in the evidence, and ``release`` says dispatch holds nothing there."""
    sim, b, _ = env
    h = await place(b, spec(), ident("nk-other"))
    tj = _stored(sim, h.ref.split("/")[1])
    tj["spec"]["suspend"] = True
    sim.store.replace(TRAINJOBS, tj)
    await caught_up(b, sim)
    obs = await b.observe(h)
    assert isinstance(obs, Observation) and obs.state is State.QUEUED
    assert obs.outcome.evidence[0].reason != "HeldByDispatch"
    assert "not dispatch's hold" in obs.outcome.evidence[0].message
    with pytest.raises(StaleHoldError, match="no hold"):
        await b.release(h, HoldToken("h-anything"))
    token = await b.hold(h)  # our hold on top: now it is ours, with a token
    assert held_by_us(_stored(sim, h.ref.split("/")[1])) == token


async def test_a_hold_that_changes_between_read_and_write_is_never_released(
    env: tuple[Simulator, Backend, str],
) -> None:
    sim, b, _ = env
    h = await place(b, spec(), ident("nk-race"), held=True)
    name = h.ref.split("/")[1]
    token = await b.hold(h)
    assert token == created_token(ident("nk-race"))
    refused = len(sim.requests.filter(method="PATCH", status=422))
    sim.faults.set_latency(1.0)  # every request waits 1 s before it is handled
    try:
        release = asyncio.create_task(b.release(h, token))
        await asyncio.sleep(1.5)  # the GET has been answered (token matches); the PATCH waits
        tj = _stored(sim, name)
        tj["metadata"]["annotations"][ANNOTATION_HOLD] = "h-someone-else"
        sim.store.replace(TRAINJOBS, tj)
        with pytest.raises(StaleHoldError, match="another hold"):
            await release
    finally:
        sim.faults.set_latency(0)
    tj = _stored(sim, name)
    assert (
        tj["metadata"]["annotations"][ANNOTATION_HOLD] == "h-someone-else" and tj["spec"]["suspend"] is True
    )
    assert len(sim.requests.filter(method="PATCH", status=422)) == refused + 1  # the test op refused it


async def test_a_concurrent_hold_is_not_overwritten(env: tuple[Simulator, Backend, str]) -> None:
    sim, b, _ = env
    h = await place(b, spec(), ident("nk-race-hold"))
    name = h.ref.split("/")[1]
    conflicts = len(sim.requests.filter(method="PATCH", status=409))
    sim.faults.set_latency(1.0)
    try:
        hold = asyncio.create_task(b.hold(h))
        await asyncio.sleep(1.5)  # read done, no hold seen; now another holder gets there first
        tj = _stored(sim, name)
        tj["metadata"]["annotations"][ANNOTATION_HOLD] = "h-first"
        tj["spec"]["suspend"] = True
        sim.store.replace(TRAINJOBS, tj)
        token = await hold
    finally:
        sim.faults.set_latency(0)
    assert token == "h-first"  # the resourceVersion precondition failed; the hold it then read is returned
    assert held_by_us(_stored(sim, name)) == "h-first"
    assert len(sim.requests.filter(method="PATCH", status=409)) == conflicts + 1  # the precondition held


async def test_hold_of_what_is_gone_or_ended(env: tuple[Simulator, Backend, str]) -> None:
    sim, b, _ = env
    h = await place(b, spec(), ident("nk-gone"))
    sim.store.delete(TRAINJOBS, "default", h.ref.split("/")[1])
    await sim.settle()
    with pytest.raises(NotFoundError):
        await b.hold(h)
    with pytest.raises(StaleHoldError, match="no longer exists"):
        await b.release(h, HoldToken("h-x"))


async def test_read_only_refuses_holds_but_shows_a_held_job(env: tuple[Simulator, Backend, str]) -> None:
    _, b, kc = env
    ro = await open_backend(config({"kubeconfig": kc}, read_only=True))
    try:
        assert not (await ro.capabilities()).holds
        h = await place(b, spec(), ident("nk-ro"))
        with pytest.raises(ReadOnlyError):
            await ro.hold(h)
        prepared = await ro.prepare(spec(), ident("nk-ro-2"), held=True)
        assert prepared.request["spec"]["suspend"] is True
        assert prepared.request["metadata"]["annotations"][ANNOTATION_HOLD] == created_token(ident("nk-ro-2"))
    finally:
        await ro.close()
