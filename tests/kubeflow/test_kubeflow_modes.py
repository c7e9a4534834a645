"""Read-only and observe-only backends, and a create whose answer was lost (a crash after create)."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_asyncio
from kubeflow_fixtures import config, ident, kubeconfig, spec

from dispatch import Mode, OutcomeUnknownError, ReadOnlyError, State
from dispatch.backend import place
from dispatch_kubeflow import Backend
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.kube import Retry
from dispatch_kubeflow.naming import native_name
from kubesim.auth import Permissions
from kubesim.resources import TRAINJOBS
from kubesim.sim import Simulator

pytestmark = pytest.mark.asyncio(loop_scope="module")
WINDOW = 0.3


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def kc(sim: Simulator, tmp_path_factory: Any) -> str:
    return kubeconfig(tmp_path_factory.mktemp("kc") / "config", sim.url, sim.token("admin"))


async def test_read_only_sends_no_write_at_all(sim: Simulator, kc: str) -> None:
    token = sim.add_identity(Permissions.admin("ro-user"))  # may write; read-only must still never try
    writer = await open_backend(config({"kubeconfig": kc}), probe_window=WINDOW)
    handle = await place(writer, spec(), ident("existing"))
    await writer.close()

    b = await open_backend(config({"kubeconfig": kc}, token=token, read_only=True), probe_window=WINDOW)
    try:
        caps = await b.capabilities()
        assert caps.read_only and not caps.writable and not caps.holds
        assert b.facts.trainer_reconciles is None  # no probe
        await b.capabilities(spec())
        preview = (await b.prepare(spec(), ident("preview"))).request
        assert preview["kind"] == "TrainJob"
        assert (await b.observe(handle)).state in (State.STARTING, State.RUNNING)
        assert [o.handle for o in await b.list() if o.handle == handle]
        for write in (
            place(b, spec(), ident("nope")),
            place(b, spec(), ident("nope"), held=True),
            b.stop(handle),
        ):
            with pytest.raises(ReadOnlyError):
                await write
        # Even a direct write through the client module is refused before it is sent.
        with pytest.raises(ReadOnlyError):
            await b._client.create(
                "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "x"}}, what="x"
            )
    finally:
        await b.close()
    mine = sim.requests.filter(identity="ro-user")
    assert mine, "the read-only backend made requests"
    assert all(r.method == "GET" for r in mine)
    assert sim.requests.writes(identity="ro-user") == []


async def test_observe_only_with_a_read_only_token(sim: Simulator, kc: str) -> None:
    b = await open_backend(config({"kubeconfig": kc}, token=sim.token("readonly")), probe_window=WINDOW)
    try:
        caps = await b.capabilities()
        assert caps.observe_only and not caps.read_only and not caps.writable
        assert b.facts.denied == ["create", "patch", "delete"]
        assert b.facts.pods_visible and b.facts.logs_readable
        assert any("observe-only" in n for n in caps.notes)
        with pytest.raises(ReadOnlyError, match="observe-only"):
            await place(b, spec(), ident("ro"))
        await b.list()
    finally:
        await b.close()
    writes = sim.requests.writes(identity="readonly")
    # Only the access reviews were POSTed (they write nothing); no TrainJob was created, not even the probe.
    assert {r.resource for r in writes} == {"selfsubjectaccessreviews"}


def _count(sim: Simulator, identity_name: str) -> int:
    return sum(1 for t in sim.store.list(TRAINJOBS, "default")[0] if t["metadata"]["name"] == identity_name)


async def test_crash_after_create_then_start_again_adopts(sim: Simulator, kc: str) -> None:
    b = await open_backend(config({"kubeconfig": kc}), probe_window=WINDOW, retry=Retry(attempts=1))
    try:
        identity = ident("crashy")
        name = native_name(identity)
        # The create lands but its answer is lost, and so is the identity lookup that follows.
        lost_before = sim.faults.injected
        sim.faults.lose_response_next(verb="create", path=r"/trainjobs$")
        sim.faults.lose_response_next(verb="get", path=rf"/trainjobs/{name}$")
        with pytest.raises(OutcomeUnknownError, match="may or may not have taken effect"):
            await place(b, spec(), identity)
        assert sim.faults.injected == lost_before + 2
        assert _count(sim, name) == 1  # the create did land
        handle = await place(b, spec(), identity)  # the supervisor starts the same identity again
        assert handle.ref == f"default/{name}"
        assert _count(sim, name) == 1
    finally:
        await b.close()


async def test_a_lost_answer_is_settled_by_the_identity_lookup(sim: Simulator, kc: str) -> None:
    b = await open_backend(config({"kubeconfig": kc}), probe_window=WINDOW, retry=Retry(attempts=1))
    try:
        identity = ident("crashy-lookup")
        lost_before = sim.faults.injected
        sim.faults.lose_response_next(verb="create", path=r"/trainjobs$")
        handle = await place(b, spec(), identity)
        assert sim.faults.injected == lost_before + 1
        assert handle.identity == identity and _count(sim, native_name(identity)) == 1
    finally:
        await b.close()


async def test_a_lost_answer_is_settled_by_the_retry_itself(sim: Simulator, kc: str) -> None:
    b: Backend = await open_backend(config({"kubeconfig": kc}), probe_window=WINDOW, retry=Retry(base=0.01))
    try:
        identity = ident("crashy-2")
        lost_before = sim.faults.injected
        sim.faults.lose_response_next(verb="create", path=r"/trainjobs$")
        handle = await place(b, spec(), identity)
        assert sim.faults.injected == lost_before + 1
        assert handle.identity == identity
        assert _count(sim, native_name(identity)) == 1
    finally:
        await b.close()


async def test_through_the_host_registry_and_open(sim: Simulator, kc: str) -> None:
    import dispatch

    backend = await dispatch.new_backend("kubeflow", config({"kubeconfig": kc}, read_only=True))
    try:
        assert isinstance(backend, Backend) and backend.mode is Mode.READ_ONLY
    finally:
        await backend.close()
    cfg = dispatch.Config(adapter={"kubeconfig": kc}, store=dispatch.MemoryStore(), read_only=True)
    async with await dispatch.open("kubeflow", cfg) as cluster:
        caps = await cluster.capabilities()
        assert caps.read_only and "kubeflow/RuntimeRef" in caps.extensions
        preview = await cluster.dry_run(spec(), job_id="via-open")
        assert preview["metadata"]["annotations"]["dispatch.dev/job-id"] == "via-open"
