"""The kubeflow adapter against kubesim over real HTTP: preflight, capabilities, start, observe, stop."""

from __future__ import annotations

import copy
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kubeflow_fixtures import (
    STOCK,
    broken_runtime,
    caught_up,
    config,
    ident,
    install,
    kubeconfig,
    spec,
    torch_runtime,
    variant,
)

import dispatch
from dispatch import (
    Absent,
    ConflictError,
    Image,
    InvalidError,
    OpaqueExtension,
    State,
    UnsupportedError,
)
from dispatch.backend import Backend as BackendProtocol
from dispatch.backend import IdentityWeakener, place
from dispatch_kubeflow import Backend, RuntimeRef
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.naming import native_name
from kubesim.resources import CLUSTERTRAININGRUNTIMES, JOBSETS, TRAINJOBS
from kubesim.sim import Simulator

pytestmark = pytest.mark.asyncio(loop_scope="module")

WINDOW = 0.3  # the probe window for tests; the real (>= 10 s) one is measured once in test_kubeflow_timing


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def kc(sim: Simulator, tmp_path_factory: Any) -> str:
    return kubeconfig(tmp_path_factory.mktemp("kc") / "config", sim.url, sim.token("admin"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend(sim: Simulator, kc: str) -> AsyncIterator[Backend]:
    install(sim, broken_runtime(), variant(torch_runtime(), "torch-small") | {"kind": "TrainingRuntime"})
    b = await open_backend(config({"kubeconfig": kc}), probe_window=WINDOW)
    yield b
    await b.close()


def trainjobs(sim: Simulator) -> list[dict[str, Any]]:
    return [
        t
        for t in sim.store.list(TRAINJOBS, "default")[0]
        if "dispatch.dev/probe" not in t["metadata"].get("labels", {})
    ]


# --- opening ---------------------------------------------------------------------------------------


async def test_registered_and_protocols(backend: Backend) -> None:
    assert "kubeflow" in dispatch.adapters()
    assert dispatch.model.extension_types()["kubeflow/RuntimeRef"] is RuntimeRef
    assert isinstance(backend, BackendProtocol)
    assert isinstance(backend, IdentityWeakener)
    assert backend.name == "kubeflow"
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="dispatch.adapters") if e.name == "kubeflow"]
    import dispatch_kubeflow

    assert ep.load() is dispatch_kubeflow.ADAPTER is dispatch.describe("kubeflow")
    assert dispatch_kubeflow.ADAPTER.factory is dispatch_kubeflow.factory
    assert dispatch_kubeflow.ADAPTER.extensions == {
        "dispatch/Image",
        "kubeflow/RuntimeRef",
        "dispatch/SharedCheckpoint",
    }


async def test_preflight_learns_the_cluster_and_cleans_up(backend: Backend, sim: Simulator) -> None:
    facts = backend.facts
    assert facts.may_write is True and facts.trainer_reconciles is True
    assert facts.pods_visible is True and facts.logs_readable is True
    assert facts.kueue is True and facts.probe_ceased is True
    caps = await backend.capabilities()
    assert caps.writable and not caps.read_only and not caps.observe_only
    assert caps.holds and not caps.queueing and not caps.shared_checkpoint
    assert "holds: through spec.suspend and the annotation dispatch.dev/hold" in caps.notes
    assert caps.extensions == {"dispatch/Image", "kubeflow/RuntimeRef"}
    assert caps.limits.max_env == 126 and caps.limits.max_command == 128
    assert "Trainer reconciles: yes" in caps.notes and "logs readable: yes" in caps.notes
    # The probe was created (gated), reconciled into a JobSet, and is gone with its pods.
    probes = [r for r in sim.requests.filter(method="POST", resource="trainjobs") if r.status == 201]
    assert probes
    assert not [
        t
        for t in sim.store.list(TRAINJOBS, "default")[0]
        if t["metadata"]["name"].startswith("dispatch-probe-")
    ]
    assert not [
        j
        for j in sim.store.list(JOBSETS, "default")[0]
        if j["metadata"]["name"].startswith("dispatch-probe-")
    ]


async def test_probe_runtime_missing_is_explained(kc: str) -> None:
    cfg = config({"kubeconfig": kc, "probeRuntime": {"kind": "ClusterTrainingRuntime", "name": "nope"}})
    with pytest.raises(UnsupportedError, match='probeRuntime ClusterTrainingRuntime "nope" was not found'):
        await open_backend(cfg, probe_window=WINDOW)


async def test_probe_on_a_namespaced_runtime(kc: str) -> None:
    cfg = config({"kubeconfig": kc, "probeRuntime": {"kind": "TrainingRuntime", "name": "torch-small"}})
    b = await open_backend(cfg, probe_window=WINDOW)
    try:
        assert b.facts.trainer_reconciles
    finally:
        await b.close()


async def test_bad_settings_and_config_are_invalid(kc: str, tmp_path: Path) -> None:
    with pytest.raises(InvalidError) as info:
        await open_backend(config({"kubeconfig": kc, "probeWindow": "1s"}))
    assert info.value.path == "probeWindow"
    with pytest.raises(InvalidError) as info:
        await open_backend(config({"kubeconfig": str(tmp_path / "missing")}))
    assert info.value.path == "kubeconfig"
    with pytest.raises(InvalidError) as info:
        await open_backend(config({"kubeconfig": kc, "context": "elsewhere"}))
    assert info.value.path == "context"
    with pytest.raises(InvalidError):
        await open_backend(dispatch.AdapterConfig("memory", b"{}"))


# --- capabilities(spec) ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(STOCK))
async def test_stock_runtimes_accepted(backend: Backend, name: str) -> None:
    caps = await backend.capabilities(spec(name))
    assert caps.writable


async def test_a_broken_runtime_is_refused_with_every_reason_creating_nothing(
    backend: Backend, sim: Simulator
) -> None:
    before = len(sim.requests.writes())
    with pytest.raises(UnsupportedError) as info:
        await backend.capabilities(spec("broken", nodes=3, procs_per_node=2))
    reasons = info.value.reasons
    assert len(reasons) == 7, reasons
    assert all(r.startswith('ClusterTrainingRuntime "broken"') for r in reasons)
    assert len(sim.requests.writes()) == before


async def test_refusals_of_extensions_and_missing_runtimes(backend: Backend) -> None:
    with pytest.raises(UnsupportedError) as info:
        await backend.capabilities(
            spec(extensions=[Image("i"), RuntimeRef("absent"), OpaqueExtension("acme/Gpu", {"n": 1})])
        )
    assert len(info.value.reasons) == 2
    assert "'acme/Gpu' is not supported" in info.value.reasons[0]
    assert 'ClusterTrainingRuntime "absent" was not found' in info.value.reasons[1]
    with pytest.raises(InvalidError) as inv:
        await backend.capabilities(spec(extensions=[RuntimeRef("torch-distributed")]))
    assert inv.value.path == 'extensions["dispatch/Image"]'
    # A TrainingRuntime is looked up in the namespace.
    await backend.capabilities(spec(extensions=[Image("i"), RuntimeRef("torch-small", "TrainingRuntime")]))
    with pytest.raises(
        UnsupportedError, match='TrainingRuntime "torch-distributed" was not found in namespace'
    ):
        await backend.capabilities(
            spec(extensions=[Image("i"), RuntimeRef("torch-distributed", "TrainingRuntime")])
        )


# --- start, dry run, observe, stop, list ------------------------------------------------------------------


async def test_prepare_reads_and_start_sends_exactly_what_was_prepared(
    backend: Backend, sim: Simulator
) -> None:
    job, identity = spec(nodes=2, env={"A": "1"}), ident("dry-1")
    writes = len(sim.requests.writes())
    prepared = await backend.prepare(job, identity)
    preview = prepared.request
    assert len(sim.requests.writes()) == writes
    assert preview["metadata"]["name"] == native_name(identity)
    sim.requests.clear()
    handle = await backend.start(prepared)
    # start reads nothing (the runtime was read by prepare) and sends one create: the prepared TrainJob.
    assert [(r.method, r.resource) for r in sim.requests] == [("POST", "trainjobs")]
    assert handle.ref == f"default/{native_name(identity)}"
    stored = sim.store.get(TRAINJOBS, "default", native_name(identity))
    assert stored["spec"]["trainer"] == preview["spec"]["trainer"]
    assert stored["spec"]["runtimePatches"][0]["manager"] == "dispatch.dev/kubeflow-adapter"
    for key in ("labels", "annotations"):
        assert preview["metadata"][key].items() <= stored["metadata"][key].items()
    # kubesim's Trainer accepted and reconciled it: a JobSet of the same name, pods carrying the identity.
    await sim.settle()
    assert sim.store.get(JOBSETS, "default", native_name(identity))
    await caught_up(backend, sim)
    obs = await backend.observe(handle)
    assert obs.state in (State.STARTING, State.RUNNING)
    assert obs.handle == handle


async def test_start_is_idempotent_per_identity(backend: Backend, sim: Simulator) -> None:
    job = spec()
    first = await place(backend, job, ident("same", 1, 0))
    again = await place(backend, job, ident("same", 1, 0))
    assert first == again
    assert len([t for t in trainjobs(sim) if t["metadata"]["name"] == native_name(ident("same"))]) == 1
    second = await place(backend, job, ident("same", 2, 1))
    assert second.ref != first.ref


async def test_same_name_other_identity_is_a_conflict(backend: Backend, sim: Simulator) -> None:
    identity = ident("squatted")
    foreign = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": native_name(identity), "namespace": "default"},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 1}},
    }
    sim.store.create(TRAINJOBS, foreign)
    with pytest.raises(ConflictError, match="not created by dispatch"):
        await place(backend, spec(), identity)
    forged = copy.deepcopy(dict((await backend.prepare(spec(), ident("victim"))).request))
    forged["metadata"]["name"] = native_name(ident("other"))
    sim.store.create(TRAINJOBS, forged)
    with pytest.raises(ConflictError):
        await place(backend, spec(), ident("other"))


async def test_held_start_suspends_without_kueue(backend: Backend, sim: Simulator) -> None:
    handle = await place(backend, spec(), ident("held-1"), held=True)
    assert sim.store.get(TRAINJOBS, "default", native_name(ident("held-1")))["spec"]["suspend"] is True
    await caught_up(backend, sim)
    assert (await backend.observe(handle)).state is State.HELD


async def test_invalid_specs_send_nothing(backend: Backend, sim: Simulator) -> None:
    writes = len(sim.requests.writes())
    with pytest.raises(InvalidError) as info:
        await place(backend, spec(env={"PET_NNODES": "3"}), ident("bad-env"))
    assert info.value.path == 'env["PET_NNODES"]'
    with pytest.raises(UnsupportedError):
        await place(backend, spec("broken"), ident("bad-runtime"))
    assert len(sim.requests.writes()) == writes


async def test_stop_deletes_in_the_foreground_and_is_idempotent(backend: Backend, sim: Simulator) -> None:
    handle = await place(backend, spec(), ident("to-stop"))
    await sim.settle()
    await backend.stop(handle)
    deletes = sim.requests.filter(method="DELETE", resource="trainjobs")
    assert deletes and deletes[-1].name == native_name(ident("to-stop"))
    await sim.settle()
    sim.advance(120)
    await backend.stop(handle)
    await caught_up(backend, sim)
    # Deleted, and nothing of it left: absent (the host's record, which asked for the stop, says cancelled).
    assert isinstance(await backend.observe(handle), Absent)


async def test_list_reports_our_trainjobs_only(backend: Backend, sim: Simulator) -> None:
    handle = await place(backend, spec(), ident("listed"))
    observed = {o.handle.identity.job_id: o for o in await backend.list()}
    assert observed["listed"].handle == handle
    assert "squatted" not in observed and "victim" not in observed
    assert all(not o.handle.ref.split("/")[1].startswith("dispatch-probe") for o in observed.values())


async def test_observe_a_vanished_trainjob_reads_absent(backend: Backend, sim: Simulator) -> None:
    handle = await place(backend, spec(), ident("vanish"))
    sim.store.delete(TRAINJOBS, "default", native_name(ident("vanish")))
    sim.advance(120)
    await caught_up(backend, sim)
    # Never "lost" from the adapter: only the host concludes that, from two absent readings.
    assert isinstance(await backend.observe(handle), Absent)


# --- errors from the API -------------------------------------------------------------------------------


async def test_retries_then_success_and_then_unavailable(backend: Backend, sim: Simulator) -> None:
    from dispatch import OutcomeUnknownError, UnavailableError
    from dispatch_kubeflow.kube import Retry

    backend._client.retry = Retry(attempts=3, base=0.01, cap=0.02)
    try:
        sim.faults.fail_next(2, 500, verb="create", path="trainjobs")
        await place(backend, spec(), ident("flaky"))
        # A runtime the shared cache does not hold is read from the cluster (it may be brand new).
        sim.faults.fail_next(3, 429, verb="get", path="clustertrainingruntimes")
        with pytest.raises(UnavailableError):
            await backend.capabilities(spec("not-in-the-cache"))
        sim.faults.fail_next(3, 503, verb="create", path="trainjobs")
        with pytest.raises(OutcomeUnknownError):
            await place(backend, spec(), ident("flaky-2"))
    finally:
        sim.faults.clear()
        backend._client.retry = Retry()


async def test_runtime_without_permission_is_permission_denied(sim: Simulator, kc: str) -> None:
    from dispatch import PermissionDeniedError
    from kubesim.auth import Permissions, Rule

    token = sim.add_identity(
        Permissions.custom(
            "trainjobs-only",
            [
                Rule.of("*", "trainer.kubeflow.org", "trainjobs"),
                Rule.of(["get", "list"], "", "*"),
                Rule.of(["get"], "*", "*", namespaces="nowhere"),
            ],
        )
    )
    # Discovery is allowed for everyone; the probe runtime read is not: preflight says so.
    with pytest.raises(PermissionDeniedError) as info:
        await open_backend(config({"kubeconfig": kc}, token=token), probe_window=WINDOW)
    assert token not in str(info.value)


async def test_a_bad_token_is_permission_denied_and_never_shown(kc: str) -> None:
    from dispatch import PermissionDeniedError

    secret = "not-a-valid-token-0123456789"
    with pytest.raises(PermissionDeniedError) as info:
        await open_backend(config({"kubeconfig": kc}, token=secret), probe_window=WINDOW)
    assert secret not in str(info.value) and secret not in repr(info.value)


async def test_stock_runtime_objects_in_the_cluster_are_ours(sim: Simulator) -> None:
    names = {r["metadata"]["name"] for r in sim.store.list(CLUSTERTRAININGRUNTIMES)[0]}
    assert set(STOCK) <= names


async def test_logs_hold_no_token(sim: Simulator, kc: str, caplog: pytest.LogCaptureFixture) -> None:
    token = sim.add_identity(__import__("kubesim.auth", fromlist=["Permissions"]).Permissions.admin("logged"))
    caplog.set_level(logging.DEBUG)
    before = len(list(sim.requests))
    b = await open_backend(config({"kubeconfig": kc}, token=token), probe_window=WINDOW)
    try:
        h = await place(b, spec(), ident("logged"))
        await caught_up(b, sim)
        await b.observe(h)
        await b.stop(h)
        assert token not in repr(b)
    finally:
        await b.close()
    assert caplog.records
    assert all(token not in r.getMessage() for r in caplog.records)
    assert all(token not in str(r.args) for r in caplog.records)
    # The token went on every request: every request of this backend was authenticated as "logged".
    mine = list(sim.requests)[before:]
    assert len(mine) > 10 and {r.identity for r in mine} == {"logged"}


async def test_a_submit_reads_its_runtime_from_the_shared_cache(backend: Backend, sim: Simulator) -> None:
    # The host prepares (every check, the runtime read from the informer's cache: the runtimes are
    # watched, not read per submit) and starts what was prepared.
    cluster = dispatch.Cluster(backend, dispatch.MemoryStore())  # not closed: the backend is shared
    # The cache filled first: run alone (or first on an xdist worker), this test opened the module's
    # backend itself, and the informer's first listing of the runtimes was counted as the submit's read.
    await caught_up(backend, sim)
    sim.requests.clear()
    rec = await cluster.submit(spec(), job_id="runtime-once")
    runtime_reads = [r for r in sim.requests if r.resource == "clustertrainingruntimes"]
    assert runtime_reads == [], [(r.method, r.path) for r in sim.requests]
    assert [r.resource for r in sim.requests.writes()] == ["trainjobs"]
    assert rec.handle is not None and rec.handle.ref == f"default/{native_name(rec.identity)}"
    await backend.stop(rec.handle)
