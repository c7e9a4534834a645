"""Fixtures shared by every kubesim test directory: a lightkube client for the ``sim`` fixture that each
directory defines (bare in ``core``, with every controller in ``e2e``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from lightkube import AsyncClient
from lightkube.config.kubeconfig import KubeConfig

from kubesim import Simulator


@pytest.fixture
async def client(sim: Simulator, tmp_path: Path) -> AsyncIterator[AsyncClient]:
    cfg = KubeConfig.from_file(sim.write_kubeconfig(tmp_path / "kubeconfig"))
    c = AsyncClient(config=cfg)
    try:
        yield c
    finally:
        await c.close()
