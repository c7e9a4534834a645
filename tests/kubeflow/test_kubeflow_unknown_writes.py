"""Writes whose outcome cannot be known (issue 10): a lost create answer followed by a failed identity
lookup is OutcomeUnknownError, never UnavailableError; cancelling the factory while the probe's create is in
flight does not leave the probe behind."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from kubeflow_fixtures import config, ident, spec
from kubeflow_live import Live, live

from dispatch import OutcomeUnknownError
from dispatch.backend import place
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.kube import Retry
from dispatch_kubeflow.naming import native_name
from kubesim.resources import TRAINJOBS


@pytest_asyncio.fixture
async def lv(tmp_path: Path) -> AsyncIterator[Live]:
    async for x in live(tmp_path):
        yield x


def _trainjobs(lv: Live) -> list[str]:
    return sorted(t["metadata"]["name"] for t in lv.sim.store.list(TRAINJOBS, "default")[0])


@pytest.mark.parametrize("lookup_fault", [500, 503])
async def test_a_lost_create_answer_then_a_failed_lookup_is_outcome_unknown(
    lv: Live, lookup_fault: int
) -> None:
    """The create lands, its answer is lost; the client's retry meets AlreadyExists; the identity lookup
    that would settle it fails: the write's outcome is unknown — the host records an unknown write."""
    backend = await open_backend(
        config({"kubeconfig": lv.kc}), probe_window=0.1, retry=Retry(attempts=2, base=0.01)
    )
    lv.opened.append(backend)
    identity = ident(f"unknown-{lookup_fault}")
    name = native_name(identity)
    lv.sim.faults.lose_response_next(verb="create", path=r"/trainjobs$")
    lv.sim.faults.fail_next(2, lookup_fault, verb="get", path=rf"/trainjobs/{name}$", retry_after=0)
    with pytest.raises(
        OutcomeUnknownError, match=r"the identity lookup failed.*may or may not have taken effect"
    ):
        await place(backend, spec(), identity)
    assert name in _trainjobs(lv)  # it did land
    handle = await place(backend, spec(), identity)  # starting the same identity again settles it
    assert handle.identity == identity and _trainjobs(lv).count(name) == 1


async def test_cancelling_the_factory_while_the_probe_create_is_in_flight_leaves_no_probe(lv: Live) -> None:
    """The cancellation lands exactly while the server handles the probe's create (the fault predicate
    runs inside that request): the create succeeds, the caller never sees the answer, and the shielded
    cleanup still deletes the probe before the cancellation completes."""
    opening: asyncio.Task[object] | None = None
    cancelled_at: list[str] = []

    def cancel_during_create(verb: str, path: str) -> bool:
        if verb == "create" and path.endswith("/trainjobs") and opening is not None and not cancelled_at:
            cancelled_at.append(path)
            opening.cancel()
        return False  # never fail the request itself: it must land

    lv.sim.faults.fail_next(1, 500, predicate=cancel_during_create)
    opening = asyncio.ensure_future(open_backend(config({"kubeconfig": lv.kc}), probe_window=0.1))
    with pytest.raises(asyncio.CancelledError):
        await opening
    assert cancelled_at, "the cancellation did not land during the probe's create"
    await lv.until(lambda: not _trainjobs(lv), "the probe removed", limit=30)
    deletes = [r for r in lv.sim.requests.filter(verb="delete") if r.resource == "trainjobs"]
    assert deletes and deletes[0].name.startswith("dispatch-probe-"), "the probe was never deleted"
