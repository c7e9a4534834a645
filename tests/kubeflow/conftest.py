"""Fixtures for the kubeflow adapter tests: one kubesim per module over real HTTP, our own runtimes."""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
import yaml
from kubeflow_fixtures import STOCK

from kubesim.kubeconfig import kubeconfig_dict
from kubesim.resources import CLUSTERTRAININGRUNTIMES, TRAININGRUNTIMES
from kubesim.sim import Simulator


def install(sim: Simulator, *runtimes: dict[str, Any], namespace: str = "default") -> None:
    """Create runtimes straight in the store (test setup; the adapter only ever talks HTTP)."""
    for rt in runtimes:
        obj = copy.deepcopy(rt)
        if obj["kind"] == "TrainingRuntime":
            obj["metadata"]["namespace"] = namespace
            sim.store.create(TRAININGRUNTIMES, obj)
        else:
            sim.store.create(CLUSTERTRAININGRUNTIMES, obj)


def kubeconfig(path: Path, server: str, token: str) -> str:
    path.write_text(yaml.safe_dump(kubeconfig_dict(server, token)))
    path.chmod(0o600)
    return str(path)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sim(tmp_path_factory: Any) -> AsyncIterator[Simulator]:
    async with Simulator(install_runtimes=False) as s:
        install(s, *(make() for make in STOCK.values()))
        yield s
