"""End-to-end fixtures: a simulator with every controller, served on loopback, and a lightkube client."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from lightkube.generic_resource import create_namespaced_resource

from kubesim import Simulator

TrainJob = create_namespaced_resource("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs")
JobSet = create_namespaced_resource("jobset.x-k8s.io", "v1alpha2", "JobSet", "jobsets")
Workload = create_namespaced_resource("kueue.x-k8s.io", "v1beta2", "Workload", "workloads")


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    async with Simulator(bookmark_interval=0.05) as s:
        yield s


async def call(
    sim: Simulator,
    method: str,
    path: str,
    body: Any = None,
    *,
    ctype: str = "application/json",
    **params: str,
) -> tuple[int, Any]:
    """One request as the admin, over HTTPS when the simulator serves TLS: (status, decoded body)."""
    ctx = ssl.create_default_context(cadata=sim.cert.cert_pem.decode()) if sim.cert is not None else None
    headers = {"Authorization": f"Bearer {sim.token('admin')}", "Content-Type": ctype}
    data = None if body is None else json.dumps(body)
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx) if ctx else None) as session,
        session.request(method, sim.url + path, data=data, headers=headers, params=params) as resp,
    ):
        return resp.status, await resp.json()
