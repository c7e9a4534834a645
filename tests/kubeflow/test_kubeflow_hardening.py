"""Hardening found by running the adapter against a real kube-apiserver (issue 8 §5), each checked on
kubesim: the annotation budget in bytes with dispatch's own annotations, int64 quantities, User-Agent,
strict field validation, warnings on writes, a preflight that refuses an old TrainJob schema and says
what probe it left behind."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from kubeflow_fixtures import STOCK, caught_up, config, ident, install, kubeconfig, spec
from kubeflow_live import SimClock

from dispatch import Cause, InvalidError, State, UnsupportedError
from dispatch_kubeflow import Backend, parse_settings
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.names import MAX_ANNOTATION_BYTES, OWN_ANNOTATION_BYTES
from kubesim.crds import trainjob_crd
from kubesim.resources import CUSTOMRESOURCEDEFINITIONS, TRAINJOBS
from kubesim.sim import Simulator

amod = pytest.mark.asyncio(loop_scope="module")

BUDGET = MAX_ANNOTATION_BYTES - OWN_ANNOTATION_BYTES
LONGEST_JOB_ID = "j" * 253


def _annotations(total_bytes: int, *, char: str = "x") -> dict[str, str]:
    key = "example.com/a"
    width = len(char.encode())
    return {key: char * ((total_bytes - len(key)) // width)}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def kc(sim: Simulator, tmp_path_factory: Any) -> str:
    return kubeconfig(tmp_path_factory.mktemp("kc") / "config", sim.url, sim.token("admin"))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def backend(kc: str) -> AsyncIterator[Backend]:
    b = await open_backend(config({"kubeconfig": kc}), probe_window=0.3)
    yield b
    await b.close()


# --- annotations: bytes, dispatch's own included ---------------------------------------------------------


@amod
async def test_annotations_at_the_budget_start_even_with_the_longest_job_id(kc: str, sim: Simulator) -> None:
    """Settings annotations filling the whole budget, plus dispatch's own for a 253-character job id at the
    largest epoch, are exactly what the API server still accepts."""
    annotations = _annotations(BUDGET)
    assert sum(len(k) + len(v) for k, v in annotations.items()) == BUDGET
    b = await open_backend(config({"kubeconfig": kc, "annotations": annotations}), probe_window=0.3)
    try:
        handle = await b.start(await b.prepare(spec(), ident(LONGEST_JOB_ID, n=999_999, r=999_998)))
        stored = sim.store.get(TRAINJOBS, "default", handle.ref.split("/", 1)[1])
        total = sum(len(k.encode()) + len(v.encode()) for k, v in stored["metadata"]["annotations"].items())
        assert total == MAX_ANNOTATION_BYTES
        await b.stop(handle)
    finally:
        await b.close()


def test_one_byte_over_the_budget_is_refused_by_parse_settings() -> None:
    with pytest.raises(InvalidError, match=r"at most 261841 are allowed") as info:
        parse_settings(json.dumps({"annotations": _annotations(BUDGET + 1)}).encode())
    assert info.value.path == "annotations"


def test_multibyte_annotations_are_counted_in_bytes() -> None:
    """131,000 characters of 'é' are 262,000 bytes: over the budget though far under it in characters."""
    wide = _annotations(262_000, char="é")
    assert sum(len(k) + len(v) for k, v in wide.items()) < BUDGET
    with pytest.raises(InvalidError, match="bytes"):
        parse_settings(json.dumps({"annotations": wide}, ensure_ascii=False).encode())


# --- quantities ------------------------------------------------------------------------------------------


def test_integer_quantities_beyond_int64_are_refused() -> None:
    raw = {"resourcesPerNode": {"limits": {"example.com/widgets": 2**63}}}
    with pytest.raises(InvalidError, match="out of range") as info:
        parse_settings(json.dumps(raw).encode())
    assert info.value.path == 'resourcesPerNode.limits["example.com/widgets"]'
    as_string = {"resourcesPerNode": {"limits": {"example.com/widgets": str(2**63)}}}
    assert parse_settings(json.dumps(as_string).encode()).resources_per_node is not None


@amod
async def test_the_largest_int64_quantity_is_accepted_by_the_server(kc: str, sim: Simulator) -> None:
    raw = {"kubeconfig": kc, "resourcesPerNode": {"limits": {"example.com/widgets": 2**63 - 1}}}
    b = await open_backend(config(raw), probe_window=0.3)
    try:
        handle = await b.start(await b.prepare(spec(), ident("int64-quantity")))
        await sim.settle()
        # Accepted by the server; no node has that many widgets, so the pod waits for capacity.
        await caught_up(b, sim)
        obs = await b.observe(handle)
        assert (obs.state, obs.cause) == (State.QUEUED, Cause.NO_CAPACITY)
        assert "example.com/widgets" in obs.outcome.evidence[0].message
        await b.stop(handle)
    finally:
        await b.close()


# --- what every request carries -------------------------------------------------------------------------


@amod
async def test_every_request_carries_the_dispatch_user_agent(kc: str, sim: Simulator) -> None:
    before = sim.requests.total
    b = await open_backend(config({"kubeconfig": kc}), probe_window=0.3)
    try:
        handle = await b.start(await b.prepare(spec(), ident("user-agent")))
        await b.observe(handle)
        await b.list()
        await b.stop(handle)
    finally:
        await b.close()
    mine = list(sim.requests)[before - sim.requests.total :] if before < sim.requests.total else []
    assert len(mine) > 10
    assert {r.user_agent for r in mine} == {f"dispatch/{version('dispatch-train')}"}


@amod
async def test_writes_are_sent_with_strict_field_validation(kc: str, sim: Simulator) -> None:
    before = sim.requests.total
    b = await open_backend(config({"kubeconfig": kc}), probe_window=0.3)
    try:
        await b.start(await b.prepare(spec(), ident("strict")))
    finally:
        await b.close()
    records = list(sim.requests)[before - sim.requests.total :]
    creates = [r for r in records if r.verb == "create"]
    assert {r.resource for r in creates} >= {"trainjobs", "selfsubjectaccessreviews"}
    assert all(r.query_dict().get("fieldValidation") == "Strict" for r in creates)


# --- warnings on writes ----------------------------------------------------------------------------------


@amod
async def test_a_warning_on_a_write_is_a_finding(backend: Backend, sim: Simulator) -> None:
    text = "trainer.kubeflow.org/v1alpha1 TrainJob is deprecated; use v1beta1"
    sim.faults.warn_next(text, verb="create", path=r"/trainjobs$")
    handle = await backend.start(await backend.prepare(spec(), ident("warned")))
    notes = (await backend.capabilities()).notes
    assert any(text in n and f'create TrainJob "{handle.ref.split("/")[1]}"' in n for n in notes), notes


@amod
async def test_a_field_the_server_dropped_fails_the_start_and_the_object_is_withdrawn(
    backend: Backend, sim: Simulator
) -> None:
    """A server that ignores fieldValidation=Strict (older than 1.25) prunes what its CRD lacks and says so
    only in a warning: the job would run without its time limit. start refuses and deletes it again."""
    sim.faults.warn_next('unknown field "spec.activeDeadlineSeconds"', verb="create", path=r"/trainjobs$")
    prepared = await backend.prepare(spec(time_limit=60), ident("pruned"))
    with pytest.raises(UnsupportedError, match=r"dropped spec\.activeDeadlineSeconds.*Trainer to v2\.3"):
        await backend.start(prepared)
    await sim.settle()
    name = prepared.request["metadata"]["name"]
    left = [t for t in sim.store.list(TRAINJOBS, "default")[0] if t["metadata"]["name"] == name]
    assert left == [] or left[0]["metadata"].get("deletionTimestamp")


# --- preflight: the TrainJob schema ----------------------------------------------------------------------


@amod
async def test_preflight_refuses_a_trainer_whose_schema_lacks_a_field_dispatch_sends(tmp_path: Path) -> None:
    async with Simulator() as old:
        old.store.replace(
            CUSTOMRESOURCEDEFINITIONS, _crd(old, without=("runtimePatches", "activeDeadlineSeconds"))
        )
        kc = kubeconfig(tmp_path / "kc", old.url, old.token("admin"))
        writes = len(old.requests.writes())
        with pytest.raises(UnsupportedError) as info:
            await open_backend(config({"kubeconfig": kc}), probe_window=0.3)
        text = str(info.value)
        assert "spec.runtimePatches" in text and "spec.activeDeadlineSeconds" in text
        assert "Kubeflow Trainer v2.2 or later" in text
        assert len(old.requests.writes()) == writes  # refused before any probe was created


@amod
async def test_preflight_reads_the_schema_of_an_int_or_string_field(tmp_path: Path) -> None:
    async with Simulator() as old:
        crd = _crd(old)
        trainer = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"][
            "trainer"
        ]
        trainer["properties"]["numProcPerNode"] = {"x-kubernetes-int-or-string": True}  # Trainer v2.0/v2.1
        old.store.replace(CUSTOMRESOURCEDEFINITIONS, crd)
        kc = kubeconfig(tmp_path / "kc", old.url, old.token("admin"))
        with pytest.raises(UnsupportedError, match=r"types spec\.trainer\.numProcPerNode as int-or-string"):
            await open_backend(config({"kubeconfig": kc}), probe_window=0.3)


@amod
async def test_without_the_crd_the_openapi_document_is_read(tmp_path: Path) -> None:
    """Credentials that may not read CRDs (here: no CRD object) fall back to the OpenAPI v3 document, which
    carries the TrainJob schema on a real server and on kubesim."""
    async with Simulator() as s:
        s.store.delete(CUSTOMRESOURCEDEFINITIONS, None, "trainjobs.trainer.kubeflow.org")
        kc = kubeconfig(tmp_path / "kc", s.url, s.token("admin"))
        b = await open_backend(config({"kubeconfig": kc}), probe_window=0.3)
        try:
            assert not any("schema could not be read" in n for n in (await b.capabilities()).notes)
        finally:
            await b.close()
        assert [r.path for r in s.requests.filter() if r.path.startswith("/openapi/v3/apis/trainer")]


@amod
async def test_an_unreadable_schema_is_a_note_not_a_refusal(tmp_path: Path) -> None:
    async with Simulator() as s:
        s.store.delete(CUSTOMRESOURCEDEFINITIONS, None, "trainjobs.trainer.kubeflow.org")
        s.faults.fail_next(1, 404, path=r"^/openapi/v3/apis/trainer\.kubeflow\.org/")
        kc = kubeconfig(tmp_path / "kc", s.url, s.token("admin"))
        b = await open_backend(config({"kubeconfig": kc}), probe_window=0.3)
        try:
            assert any("TrainJob schema could not be read" in n for n in (await b.capabilities()).notes)
        finally:
            await b.close()


def _crd(sim: Simulator, **kw: Any) -> dict[str, Any]:
    current = sim.store.get(CUSTOMRESOURCEDEFINITIONS, None, "trainjobs.trainer.kubeflow.org")
    crd = trainjob_crd(**kw)
    crd["metadata"] = current["metadata"]
    return crd


# --- preflight: the probe it leaves behind ---------------------------------------------------------------


class _SimClock(SimClock):
    """The cluster's clock, moved by every sleep (no test here moves it)."""

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)
        self.sim.advance(seconds)


@amod
async def test_a_failed_preflight_says_what_probe_it_left_behind(tmp_path: Path) -> None:
    """No Trainer controller (preflight fails) and a finalizer nobody removes on the probe: the delete is
    tried, the probe stays, and the error names it and says how to remove it."""
    async with Simulator(controllers=[]) as bare:
        install(bare, *(make() for make in STOCK.values()))

        def stuck(op: str, rt: Any, new: dict[str, Any], old: dict[str, Any] | None) -> None:
            if op == "CREATE" and new["metadata"]["name"].startswith("dispatch-probe-"):
                new["metadata"]["finalizers"] = ["example.com/never-removed"]

        bare.store.add_admission(TRAINJOBS, stuck)
        kc = kubeconfig(tmp_path / "kc", bare.url, bare.token("admin"))
        with pytest.raises(UnsupportedError) as info:
            await open_backend(config({"kubeconfig": kc}), probe_window=1, clock=_SimClock(bare))
        (probe,) = [
            t
            for t in bare.store.list(TRAINJOBS, "default")[0]
            if t["metadata"]["name"].startswith("dispatch-probe-")
        ]
        name = probe["metadata"]["name"]
        assert probe["metadata"].get("deletionTimestamp"), "preflight did not try to delete its probe"
        reasons = info.value.reasons
        assert "did not reconcile" in reasons[0]
        left = reasons[-1]
        assert f'left its probe TrainJob "{name}" behind' in left
        assert "example.com/never-removed" in left
        assert f"kubectl -n default delete trainjob {name}" in left
        assert f"kubectl -n default patch trainjob {name}" in left


@amod
async def test_a_probe_the_server_pruned_is_refused_and_removed(tmp_path: Path) -> None:
    async with Simulator(install_runtimes=False) as s:
        install(s, *(make() for make in STOCK.values()))
        s.faults.warn_next('unknown field "spec.runtimePatches"', verb="create", path=r"/trainjobs$")
        kc = kubeconfig(tmp_path / "kc", s.url, s.token("admin"))
        with pytest.raises(UnsupportedError, match=r"dropped spec\.runtimePatches"):
            await open_backend(config({"kubeconfig": kc}), probe_window=0.3)
        await s.settle()
        assert [
            t for t in s.store.list(TRAINJOBS, "default")[0] if not t["metadata"].get("deletionTimestamp")
        ] == []


@amod
async def test_a_field_the_cluster_does_not_know_is_refused_not_pruned(
    backend: Backend, sim: Simulator
) -> None:
    """With fieldValidation=Strict the API server answers 400 for a field its schema lacks (as an older
    Trainer's CRD lacks runtimePatches) instead of dropping it with only a warning."""
    prepared = await backend.prepare(spec(), ident("unknown-field"))
    request = copy.deepcopy(dict(prepared.request))
    request["spec"]["notAFieldOfTrainJob"] = True
    with pytest.raises(InvalidError, match=r'unknown field "spec\.notAFieldOfTrainJob"'):
        await backend.start(prepared.replace(request=request))
    assert (
        sim.store.list(TRAINJOBS, "default", field_selector=f"metadata.name={request['metadata']['name']}")[0]
        == []
    )
