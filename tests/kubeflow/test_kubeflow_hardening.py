"""Hardening found by running the adapter against a real kube-apiserver (issue 8 §5), each checked on
kubesim: the annotation budget in bytes with dispatch's own annotations, int64 quantities, User-Agent,
strict field validation, warnings on writes, a preflight that refuses an old TrainJob schema and says
what probe it left behind."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from kubeflow_fixtures import config, ident, kubeconfig, spec

from dispatch import Cause, InvalidError, State
from dispatch_kubeflow import Backend, parse_settings
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.names import MAX_ANNOTATION_BYTES, OWN_ANNOTATION_BYTES
from kubesim.resources import TRAINJOBS
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
        obs = await b.observe(handle)
        assert (obs.state, obs.cause) == (State.QUEUED, Cause.NO_CAPACITY)
        assert "example.com/widgets" in obs.outcome.evidence[0].message
        await b.stop(handle)
    finally:
        await b.close()
