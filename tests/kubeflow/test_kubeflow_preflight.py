"""Preflight failures explain themselves, and the probe never outlives preflight."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from kubeflow_fixtures import STOCK, config, install, kubeconfig

from dispatch import UnavailableError, UnsupportedError
from dispatch_kubeflow.backend import open_backend
from dispatch_kubeflow.kube import Retry
from kubesim.errors import ApiError
from kubesim.resources import PODS, TRAINJOBS
from kubesim.sim import Simulator

pytestmark = pytest.mark.asyncio(loop_scope="module")


def _probes(sim: Simulator) -> list[dict[str, Any]]:
    return [
        t
        for t in sim.store.list(TRAINJOBS, "default")[0]
        if t["metadata"]["name"].startswith("dispatch-probe-")
    ]


async def test_no_trainer_controller_is_explained_and_the_probe_removed(tmp_path: Path) -> None:
    async with Simulator(controllers=[]) as bare:
        install(bare, *(make() for make in STOCK.values()))
        kc = kubeconfig(tmp_path / "kc", bare.url, bare.token("admin"))
        with pytest.raises(UnsupportedError, match="Trainer controller did not reconcile"):
            await open_backend(config({"kubeconfig": kc}), probe_window=0.3)
        assert _probes(bare) == []


async def test_a_webhook_refusing_the_probe_is_explained(sim: Simulator, tmp_path: Path) -> None:
    def refuse(op: str, rt: Any, new: dict[str, Any], old: dict[str, Any] | None) -> None:
        if op == "CREATE" and new["metadata"]["name"].startswith("dispatch-probe-"):
            raise ApiError(
                403, "Forbidden", 'admission webhook "policy.example.com" denied the request: no probes here'
            )

    sim.store.add_admission(TRAINJOBS, refuse)
    kc = kubeconfig(tmp_path / "kc", sim.url, sim.token("admin"))
    with pytest.raises(UnsupportedError, match=r"refused the probe TrainJob.*no probes here"):
        await open_backend(config({"kubeconfig": kc}), probe_window=0.3)


async def test_the_probe_is_cleaned_up_when_opening_is_cancelled(tmp_path: Path) -> None:
    async with Simulator(install_runtimes=False) as s:
        install(s, *(make() for make in STOCK.values()))
        kc = kubeconfig(tmp_path / "kc", s.url, s.token("admin"))
        task = asyncio.create_task(open_backend(config({"kubeconfig": kc}), probe_window=30))
        for _ in range(1000):  # up to 20 s: on a loaded 2-core machine preflight's first requests are slow
            await asyncio.sleep(0.02)
            if _probes(s):
                break
        assert _probes(s), "the probe never appeared"
        name = _probes(s)[0]["metadata"]["name"]
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await s.settle()
        assert _probes(s) == []
        pods = s.store.list(PODS, "default", label_selector=f"jobset.sigs.k8s.io/jobset-name={name}")[0]
        assert pods == []


async def test_a_lost_answer_to_the_probe_create_leaves_no_probe(tmp_path: Path) -> None:
    async with Simulator(install_runtimes=False) as s:
        install(s, *(make() for make in STOCK.values()))
        kc = kubeconfig(tmp_path / "kc", s.url, s.token("admin"))
        # The client retries the create, which then meets the probe its lost first attempt made: still ours.
        s.faults.lose_response_next(verb="create", path=r"/trainjobs$")
        b = await open_backend(config({"kubeconfig": kc}), probe_window=0.3, retry=Retry(base=0.01))
        try:
            assert b.facts.trainer_reconciles and b.facts.probe_ceased
        finally:
            await b.close()
        assert _probes(s) == []
        # Without retries the open fails, but the probe that landed is removed first.
        s.faults.lose_response_next(verb="create", path=r"/trainjobs$")
        with pytest.raises(UnavailableError, match="failed before an answer"):
            await open_backend(config({"kubeconfig": kc}), probe_window=0.3, retry=Retry(attempts=1))
        await s.settle()
        assert _probes(s) == []


async def test_an_unreachable_cluster_is_unavailable(tmp_path: Path) -> None:
    kc = kubeconfig(tmp_path / "kc", "http://127.0.0.1:9", "token")
    with pytest.raises(UnavailableError, match="could not be reached"):
        await open_backend(config({"kubeconfig": kc}), retry=Retry(attempts=2, base=0.01))


async def test_a_cluster_without_kueue(tmp_path: Path) -> None:
    async with Simulator(install_runtimes=False, kueue=False) as plain:
        install(plain, *(make() for make in STOCK.values()))
        kc = kubeconfig(tmp_path / "kc", plain.url, plain.token("admin"))
        b = await open_backend(config({"kubeconfig": kc}), probe_window=0.3)
        try:
            caps = await b.capabilities()
            assert not b.facts.kueue and b.facts.kueue_takes_jobs is None
            assert caps.holds and not caps.queueing and "Kueue absent" in caps.notes
        finally:
            await b.close()
        with pytest.raises(UnsupportedError, match=r"Kueue .* is not served"):
            await open_backend(config({"kubeconfig": kc, "queue": "q"}), probe_window=0.3)
