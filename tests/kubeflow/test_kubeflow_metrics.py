"""The Kubernetes layer counts its requests in dispatch's metrics (when enabled), with bounded labels."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import pytest_asyncio
from kubeflow_fixtures import config, kubeconfig
from prometheus_client.parser import text_string_to_metric_families

from dispatch import metrics
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.kube import resource_of
from kubesim.sim import Simulator


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def kc(sim: Simulator, tmp_path_factory: Any) -> str:
    return kubeconfig(tmp_path_factory.mktemp("kc") / "config", sim.url, sim.token("admin"))


@pytest.fixture
def recorder() -> Iterator[metrics.Metrics]:
    rec = metrics.enable()
    try:
        yield rec
    finally:
        metrics.disable()


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs", ("trainjobs", True)),
        ("/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/j-1-abc", ("trainjobs", False)),
        ("/api/v1/namespaces/default/pods/p-0/log", ("pods/log", False)),
        ("/apis/kueue.x-k8s.io/v1beta2/namespaces/d/workloads/w/status", ("workloads/status", False)),
        (
            "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes/torch",
            ("clustertrainingruntimes", False),
        ),
        ("/api/v1/namespaces", ("namespaces", True)),
        ("/apis/jobset.x-k8s.io/v1alpha2", ("discovery", False)),
    ],
)
def test_a_path_names_a_bounded_resource(path: str, expected: tuple[str, bool]) -> None:
    assert resource_of(path) == expected


@pytest.mark.asyncio(loop_scope="module")
async def test_requests_are_counted_by_verb_resource_and_status(
    sim: Simulator, kc: str, recorder: metrics.Metrics
) -> None:
    backend = await open_backend(config({"kubeconfig": kc}, read_only=True))
    try:
        await backend.list()
    finally:
        await backend.close()
    families = {f.name: f for f in text_string_to_metric_families(recorder.exposition().decode())}
    counted = {
        (s.labels["verb"], s.labels["resource"], s.labels["status"]): s.value
        for s in families["dispatch_api_requests"].samples
        if s.name == "dispatch_api_requests_total"
    }
    assert counted[("list", "trainjobs", "2xx")] >= 1, counted
    assert counted[("get", "discovery", "2xx")] >= 1, counted  # preflight's API discovery
    # No label value carries an object's name: every resource is a kind (or kind/subresource).
    assert all("-" not in resource for _, resource, _ in counted)
    latency = [
        s for s in families["dispatch_api_request_duration_seconds"].samples if s.name.endswith("_count")
    ]
    assert sum(s.value for s in latency) == sum(counted.values())
