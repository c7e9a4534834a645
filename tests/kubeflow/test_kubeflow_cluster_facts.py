"""A read-only open reuses what does not change per command — API discovery, the TrainJob CRD's version, the
cluster's identity — from the host's probe cache (dispatch_kubeflow.clusterfacts): for ten minutes, of the
same server presenting the same certificate; a gap in discovery is read and said every time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubeflow_fixtures import STOCK, install

from dispatch.clock import Clock
from dispatch.config import AdapterConfig
from dispatch.errors import UnsupportedError
from dispatch.probecache import MemoryProbeCache
from dispatch_kubeflow import clusterfacts
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.kube import KubeClient
from dispatch_kubeflow.settings import parse_settings
from kubesim.sim import Simulator

FACTS = {
    "/apis/trainer.kubeflow.org/v1alpha1",
    "/apis/jobset.x-k8s.io/v1alpha2",
    "/apis/kueue.x-k8s.io/v1beta2",
}


class Later(Clock):
    """The system's clock, ``offset`` seconds on."""

    def __init__(self, offset: float) -> None:
        import time

        self._time = time
        self.offset = offset

    def now(self) -> float:
        return self._time.time() + self.offset

    async def sleep(self, seconds: float) -> None:
        import asyncio

        await asyncio.sleep(seconds)


def config(settings: dict[str, str], cache: MemoryProbeCache) -> AdapterConfig:
    """A read-only open's configuration, with the host's probe cache."""
    return AdapterConfig("kubeflow", json.dumps(settings).encode(), read_only=True, probe_cache=cache)


def _opening(sim: Simulator, before: int) -> list[str]:
    """What an open asked before its first list: discovery, the CRD, the kube-system namespace."""
    return [r.path for r in list(sim.requests)[before:] if r.verb != "list"]


async def test_a_read_only_open_reuses_the_cluster_facts_while_they_hold(tmp_path: Path) -> None:
    async with Simulator(tls=True, install_runtimes=False) as sim:
        install(sim, *(make() for make in STOCK.values()))
        kc = str(sim.write_kubeconfig(tmp_path / "kc", token="readonly"))
        cache = MemoryProbeCache()

        async def open_(
            clock: Clock | None = None, cache_: MemoryProbeCache = cache
        ) -> tuple[list[str], str]:
            before = len(list(sim.requests))
            backend = await open_backend(config({"kubeconfig": kc}, cache_), clock=clock)
            try:
                return _opening(sim, before), backend.cluster_id
            finally:
                await backend.close()

        first, cluster = await open_(None)
        assert set(first) >= FACTS and "/api/v1/namespaces/kube-system" in first
        assert cluster.startswith("kubernetes:") and sim.url not in cluster  # the namespace's uid
        again, same = await open_(None)
        assert again == [] and same == cluster  # nothing asked before the command's own reads
        # Past the TTL, or with `check --refresh` (a cache that always misses), read anew.
        late, _ = await open_(Later(clusterfacts.TTL + 1))
        assert set(late) >= FACTS
        fresh, _ = await open_(None, MemoryProbeCache(refresh=True))
        assert set(fresh) >= FACTS
        # Another certificate at the same address (a cluster made anew): read anew.
        settings = parse_settings(json.dumps({"kubeconfig": kc}).encode())
        client = KubeClient.connect(kubeconfig=kc)
        try:
            key = clusterfacts.cache_key(client, settings)
        finally:
            await client.close()
        entry = dict(await cache.get(key) or {})
        assert entry["certificate"] and entry["cluster"] == cluster
        await cache.put(key, {**entry, "certificate": "0" * 64, "cluster": "kubernetes:another"})
        moved, third = await open_(None)
        assert set(moved) >= FACTS and third == cluster


async def test_a_gap_in_discovery_is_never_cached(tmp_path: Path) -> None:
    async with Simulator(install_runtimes=False, disabled_groups={"jobset.x-k8s.io"}) as sim:
        install(sim, *(make() for make in STOCK.values()))
        kc = str(sim.write_kubeconfig(tmp_path / "kc", token="readonly"))
        cache = MemoryProbeCache()
        for _ in range(2):
            with pytest.raises(UnsupportedError, match="JobSet"):
                await open_backend(config({"kubeconfig": kc}, cache))
        assert not cache._values


async def test_an_identity_read_from_the_address_is_not_handed_on(tmp_path: Path) -> None:
    """Credentials that may not read kube-system name the cluster by its address: that name is not kept
    for others (the facts are, and the identity is read again)."""
    from kubeflow_fixtures import kubeconfig

    from kubesim.auth import Permissions, Rule

    async with Simulator(install_runtimes=False) as sim:
        install(sim, *(make() for make in STOCK.values()))
        groups = ["trainer.kubeflow.org", "jobset.x-k8s.io", "batch", "kueue.x-k8s.io"]
        token = sim.add_identity(
            Permissions("no-namespaces", (Rule.of("*", groups, "*"), Rule.of("*", [""], "pods")))
        )
        kc = kubeconfig(tmp_path / "kc", sim.url, token)
        cache = MemoryProbeCache()
        ids = []
        for _ in range(2):
            before = len(list(sim.requests))
            backend = await open_backend(config({"kubeconfig": kc}, cache))
            ids.append(backend.cluster_id)
            await backend.close()
            asked = _opening(sim, before)
        assert ids[0] == ids[1] and sim.url in ids[0]
        assert asked == ["/api/v1/namespaces/kube-system"]  # the facts from the cache, the identity anew
