"""The probe cache (SPEC §9.3): a host-held cache lets the factory skip the gated probe while the
fingerprint (API server, Trainer CRD, probe runtime) is unchanged and ``probeTTL`` has not passed."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from kubeflow_fixtures import kubeconfig

from dispatch import AdapterConfig, MemoryProbeCache, MemoryStore, StoreProbeCache
from dispatch_kubeflow import Backend
from dispatch_kubeflow.backend import open_backend
from kubesim.resources import CLUSTERTRAININGRUNTIMES
from kubesim.sim import Simulator

pytestmark = pytest.mark.asyncio(loop_scope="module")

WINDOW = 0.3


def _cfg(kc: str, cache: object, **settings: object) -> AdapterConfig:
    return AdapterConfig(
        "kubeflow",
        json.dumps({"kubeconfig": kc, **settings}).encode(),
        probe_cache=cache,  # type: ignore[arg-type]
    )


def _probe_creates(sim: Simulator) -> int:
    return sum(1 for r in sim.requests.writes() if r.resource == "trainjobs" and r.verb == "create")


async def _open(cfg: AdapterConfig) -> Backend:
    return await open_backend(cfg, probe_window=WINDOW)


async def test_the_second_open_reuses_the_findings_and_creates_nothing(
    sim: Simulator, tmp_path: Path
) -> None:
    kc = kubeconfig(tmp_path / "kc", sim.url, sim.token("admin"))
    store = MemoryStore()
    cache = StoreProbeCache(store)
    first = await _open(_cfg(kc, cache))
    await first.close()
    assert not first.facts.from_cache and first.facts.trainer_reconciles
    sim.requests.clear()
    second = await _open(_cfg(kc, cache))
    await second.close()
    assert second.facts.from_cache
    assert _probe_creates(sim) == 0
    # Only the access reviews are sent with a write verb (they are how a client asks, and change nothing).
    assert {r.resource for r in sim.requests.writes()} == {"selfsubjectaccessreviews"}
    for name in ("trainer_reconciles", "kueue_takes_jobs", "pods_visible", "logs_readable"):
        assert getattr(second.facts, name) == getattr(first.facts, name), name
    assert any("reused" in n for n in (await second.capabilities()).notes)
    # It watched no probe: none was created (above). Its speed is measured in benchmarks/, not here.


async def test_a_changed_probe_runtime_probes_again(sim: Simulator, tmp_path: Path) -> None:
    kc = kubeconfig(tmp_path / "kc", sim.url, sim.token("admin"))
    cache = MemoryProbeCache()
    await (await _open(_cfg(kc, cache))).close()
    runtime = copy.deepcopy(sim.store.get(CLUSTERTRAININGRUNTIMES, None, "torch-distributed"))
    runtime["metadata"].setdefault("annotations", {})["touched"] = "yes"
    sim.store.replace(CLUSTERTRAININGRUNTIMES, runtime)  # a new resourceVersion
    before = _probe_creates(sim)
    again = await _open(_cfg(kc, cache))
    await again.close()
    assert not again.facts.from_cache
    assert _probe_creates(sim) == before + 1


async def test_refresh_an_expired_ttl_or_a_corrupt_entry_probe_again(sim: Simulator, tmp_path: Path) -> None:
    kc = kubeconfig(tmp_path / "kc", sim.url, sim.token("admin"))
    store = MemoryStore()
    await (await _open(_cfg(kc, StoreProbeCache(store)))).close()
    for cache, settings in (
        (StoreProbeCache(store, refresh=True), {}),  # dispatch check --refresh
        (StoreProbeCache(store), {"probeTTL": "0s"}),  # no reuse at all
    ):
        before = _probe_creates(sim)
        b = await _open(_cfg(kc, cache, **settings))
        await b.close()
        assert not b.facts.from_cache and _probe_creates(sim) == before + 1
    # An entry older than the TTL is not reused.
    (key,) = [k for k in store._values if k.startswith("probe/")]
    entry = json.loads(store._values[key])
    entry["at"] -= 3601
    await store.put_value(key, json.dumps(entry))
    b = await _open(_cfg(kc, StoreProbeCache(store)))
    await b.close()
    assert not b.facts.from_cache
    # A corrupt entry is not a reason to refuse the cluster: it probes and overwrites it.
    await store.put_value(key, "{not json")
    b = await _open(_cfg(kc, StoreProbeCache(store)))
    await b.close()
    assert not b.facts.from_cache
    assert json.loads(await store.get_value(key) or "")["format"] == 2
    # A format-1 entry is not reused: its "pods visible: no" may only mean that no probe pod appeared in
    # the window, which stopped the backend following pods.
    old = json.loads(await store.get_value(key) or "")
    old["format"] = 1
    old["facts"]["pods_visible"] = False
    await store.put_value(key, json.dumps(old))
    b = await _open(_cfg(kc, StoreProbeCache(store)))
    await b.close()
    assert not b.facts.from_cache and b.facts.pods_visible is True


async def test_read_only_keeps_no_probe_findings(sim: Simulator, tmp_path: Path) -> None:
    kc = kubeconfig(tmp_path / "kc", sim.url, sim.token("admin"))
    cache = MemoryProbeCache()
    cfg = AdapterConfig(
        "kubeflow", json.dumps({"kubeconfig": kc}).encode(), read_only=True, probe_cache=cache
    )
    sim.requests.clear()
    b = await _open(cfg)
    await b.close()
    assert sim.requests.writes() == []
    # No probe findings: only the cluster's facts (discovery, identity) a read-only open keeps for the
    # next command (dispatch_kubeflow.clusterfacts).
    assert [k.split("/")[0] for k in cache._values] == ["kubeflow-cluster"]


async def test_a_config_refuses_a_cache_that_is_not_one() -> None:
    from dispatch import Config, InvalidError

    with pytest.raises(InvalidError) as info:
        Config(probe_cache="nope")  # type: ignore[arg-type]
    assert info.value.path == "probe_cache"
    with pytest.raises(InvalidError):
        StoreProbeCache(object())  # type: ignore[arg-type]


async def test_changed_permissions_probe_again(sim: Simulator, tmp_path: Path) -> None:
    """What the probe learned about pods depends on what the credentials may read: findings made while
    pods could not be listed are not reused once they can (nor the other way round)."""
    from kubesim.auth import Permissions, Rule

    everything = Rule.of("*", "*", "*")
    no_pods = [
        Rule.of("*", "*", "*", namespaces="kube-system"),  # something, elsewhere
        Rule.of(
            "*",
            "*",
            [
                "trainjobs", "jobsets", "jobs", "workloads", "localqueues", "clusterqueues", "admissionchecks",
                "clustertrainingruntimes", "trainingruntimes", "customresourcedefinitions", "nodes", "events",
                "configmaps", "selfsubjectaccessreviews", "selfsubjectrulesreviews", "pods/log",
            ],
        ),
    ]  # fmt: skip
    token = sim.add_identity(Permissions.custom("pods-later", no_pods))
    kc = kubeconfig(tmp_path / "kc", sim.url, token)
    cache = MemoryProbeCache()
    first = await _open(_cfg(kc, cache))
    await first.close()
    assert first.facts.pods_visible is False and not first.facts.from_cache
    sim.add_identity(Permissions.custom("pods-later", [everything]), token=token)  # RBAC granted pods
    before = _probe_creates(sim)
    again = await _open(_cfg(kc, cache))
    await again.close()
    assert not again.facts.from_cache and _probe_creates(sim) == before + 1
    assert again.facts.pods_visible is True
    third = await _open(_cfg(kc, cache))  # unchanged since: reused
    await third.close()
    assert third.facts.from_cache and third.facts.pods_visible is True
