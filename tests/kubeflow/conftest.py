"""Fixtures for the kubeflow adapter tests: one kubesim per module over real HTTP, with our own runtimes.

(Helpers live in ``kubeflow_fixtures``: test directories share the module name ``conftest``.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from kubeflow_fixtures import STOCK, install

from kubesim.sim import Simulator


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sim(tmp_path_factory: Any) -> AsyncIterator[Simulator]:
    async with Simulator(install_runtimes=False) as s:
        install(s, *(make() for make in STOCK.values()))
        yield s
