"""Under Kueue: the probe learns that Kueue takes jobs; TrainJobs carry the queue and priority labels."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kubeflow_fixtures import config, ident, kubeconfig, spec

from dispatch import State, UnsupportedError
from dispatch.backend import place
from dispatch_kubeflow import Backend
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.naming import native_name
from kubesim.resources import TRAINJOBS
from kubesim.sim import Simulator

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def queued(sim: Simulator, tmp_path_factory: Any) -> AsyncIterator[Backend]:
    kc = kubeconfig(tmp_path_factory.mktemp("kc") / "config", sim.url, sim.token("admin"))
    b = await open_backend(
        config({"kubeconfig": kc, "queue": "user-queue", "labels": {"team": "a"}}), probe_window=0.3
    )
    yield b
    await b.close()


async def test_the_probe_sees_kueue_take_the_job(queued: Backend) -> None:
    assert queued.facts.kueue and queued.facts.kueue_takes_jobs is True
    caps = await queued.capabilities()
    assert caps.queueing and not caps.holds  # under Kueue, holds need settings admissionCheck
    assert any(n.startswith("holds: ") and "admissionCheck" in n for n in caps.notes)
    assert "Kueue takes jobs: yes" in caps.notes


async def test_a_queued_trainjob_carries_the_queue_label(queued: Backend, sim: Simulator) -> None:
    handle = await place(queued, spec(), ident("queued-1"))
    stored = sim.store.get(TRAINJOBS, "default", native_name(ident("queued-1")))
    assert stored["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "user-queue"
    assert stored["metadata"]["labels"]["team"] == "a"
    await sim.settle()
    assert (await queued.observe(handle)).state in (State.QUEUED, State.STARTING, State.RUNNING)


async def test_held_under_kueue_is_refused_before_anything_is_sent(queued: Backend, sim: Simulator) -> None:
    writes = len(sim.requests.writes())
    with pytest.raises(UnsupportedError, match="set settings admissionCheck"):
        await place(queued, spec(), ident("held-q"), held=True)
    assert len(sim.requests.writes()) == writes


async def test_missing_kueue_objects_are_refused_at_open(sim: Simulator, tmp_path: Path) -> None:
    kc = kubeconfig(tmp_path / "kc", sim.url, sim.token("admin"))
    settings = {"kubeconfig": kc, "queue": "no-such-queue", "priorityClass": "nope", "admissionCheck": "nope"}
    writes = len(sim.requests.writes())
    with pytest.raises(UnsupportedError) as info:
        await open_backend(config(settings), probe_window=0.3)
    assert [r.split('"')[0] for r in info.value.reasons] == [
        "settings.queue: the Kueue LocalQueue ",
        "settings.priorityClass: the Kueue WorkloadPriorityClass ",
        "settings.admissionCheck: the Kueue AdmissionCheck ",
    ]
    assert "LocalQueues that exist: user-queue" in info.value.reasons[0]  # the alternatives
    assert len(sim.requests.writes()) == writes + 5  # the five access reviews; no probe was created
    ro = await open_backend(config(settings, read_only=True))
    try:
        assert len((await ro.capabilities()).notes) and any("no-such-queue" in n for n in ro.facts.notes)
    finally:
        await ro.close()
