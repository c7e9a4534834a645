"""The one test that opens the adapter with the real probe window (>= 10 s, from the settings' default).

A lower bound only: at least the window (preflight must watch the probe that long; sleeping never ends
early). How long beyond it depends on the machine's load, so it is not asserted.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from kubeflow_fixtures import config, kubeconfig

import dispatch_kubeflow
from kubesim.sim import Simulator

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.mark.timeout(600)
async def test_factory_takes_the_probe_window(sim: Simulator, tmp_path: Path) -> None:
    cfg = config({"kubeconfig": kubeconfig(tmp_path / "kc", sim.url, sim.token("admin"))})
    started = time.monotonic()
    backend = await dispatch_kubeflow.factory(cfg)
    elapsed = time.monotonic() - started
    try:
        assert isinstance(backend, dispatch_kubeflow.Backend)
        assert backend.facts.trainer_reconciles and backend.facts.probe_ceased
    finally:
        await backend.close()
    assert elapsed >= 10.0, elapsed
