"""The conformance suite on kubeflow under Kueue, with holds through the admission check: jobs go through
the LocalQueue ``user-queue``, whose ClusterQueue lists the AdmissionCheck served by ``dispatch-admission``,
running in-process over real HTTP. ``settle`` waits for kubesim's controllers and for dispatch-admission."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest_asyncio
from admission_fixtures import CHECK, install_check, running, settle
from kubeflow_fixtures import config, install, torch_runtime
from test_kubeflow_conformance import KubeflowHarness, _runtime

from dispatch import Backend
from dispatch.conformance import *  # noqa: F403  (the checks: test_conformance_*)
from dispatch.conformance import BaseHarness
from dispatch_kubeflow.admission import AdmissionController
from dispatch_kubeflow.backend import open_backend
from kubesim.sim import Simulator


class KueueHarness(KubeflowHarness):
    def __init__(self, sim: Simulator, kc: str, ctl: AdmissionController) -> None:
        super().__init__(sim, kc)
        self.ctl = ctl

    async def open(self, *, read_only: bool = False) -> Backend:
        settings = {"kubeconfig": self.kc, "queue": "user-queue", "admissionCheck": CHECK}
        backend = await open_backend(config(settings, read_only=read_only), probe_window=0.1)
        self.opened.append(backend)
        return backend

    async def settle(self) -> None:
        await settle(self.sim, self.ctl)
        await BaseHarness.settle(self)


@pytest_asyncio.fixture
async def harness(tmp_path: Path) -> AsyncIterator[KueueHarness]:
    async with Simulator(install_runtimes=False) as sim:
        install(sim, torch_runtime(), _runtime())
        install_check(sim)
        kc = str(sim.write_kubeconfig(tmp_path / "kc"))
        async with running(kc) as ctl:
            await settle(sim, ctl)
            h = KueueHarness(sim, kc, ctl)
            try:
                yield h
            finally:
                await h.close()
