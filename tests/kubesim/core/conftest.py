"""Fixtures: an API server with kube-controller-manager's garbage collector and nothing else (no Trainer,
JobSet, Job, scheduler or kubelet), served over real HTTP on loopback, and clients for it."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from lightkube.generic_resource import create_namespaced_resource

from kubesim import Simulator
from kubesim.controllers import GarbageCollectorController

TrainJob = create_namespaced_resource("trainer.kubeflow.org", "v1alpha1", "TrainJob", "trainjobs")


@pytest.fixture
async def sim() -> AsyncIterator[Simulator]:
    # The collector runs after a DELETE has been answered: a test waits for a cascade as a client does.
    async with Simulator(controllers=[GarbageCollectorController()], bookmark_interval=0.05) as s:
        yield s


class Raw:
    """A plain HTTP client for status codes and bodies exactly as the server sends them."""

    def __init__(self, sim: Simulator, session: aiohttp.ClientSession, token: str | None) -> None:
        self.sim = sim
        self.session = session
        self.token = token

    def headers(self, content_type: str = "application/json") -> dict[str, str]:
        h = {"Content-Type": content_type}
        if self.token is not None:
            h["Authorization"] = f"Bearer {self.token}"
        return h

    async def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> tuple[int, Any, dict[str, str]]:
        data = None
        if body is not None:
            data = body if isinstance(body, str | bytes) else json.dumps(body)
        async with self.session.request(
            method, self.sim.url + path, data=data, headers=self.headers(content_type), params=params
        ) as resp:
            text = await resp.text()
            try:
                parsed: Any = json.loads(text)
            except ValueError:
                parsed = text
            return resp.status, parsed, dict(resp.headers)

    async def stream_lines(self, path: str, params: dict[str, str], *, limit: int | None = None) -> list[Any]:
        """Read a watch stream to its end (or ``limit`` events) and return the decoded events."""
        out: list[Any] = []
        async with self.session.get(self.sim.url + path, headers=self.headers(), params=params) as resp:
            assert resp.status == 200, await resp.text()
            async for raw in resp.content:
                if raw.strip():
                    out.append(json.loads(raw))
                    if limit is not None and len(out) >= limit:
                        break
        return out

    async def until(self, path: str, done: Callable[[int, Any], bool], *, polls: int = 500) -> Any:
        """GET ``path`` until ``done(status, body)`` holds, as a client waits for a cascade the garbage
        collector completes after the DELETE was answered; the last body."""
        for _ in range(polls):
            code, body, _ = await self.request("GET", path)
            if done(code, body):
                return body
            await asyncio.sleep(0.01)
        raise AssertionError(f"GET {path} never reached the awaited state: {code} {body}")

    async def until_gone(self, path: str) -> None:
        await self.until(path, lambda code, _: code == 404)


@pytest.fixture
async def raw(sim: Simulator) -> AsyncIterator[Raw]:
    async with aiohttp.ClientSession() as session:
        yield Raw(sim, session, sim.token("admin"))


def configmap(name: str, ns: str = "default", **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": ns, **meta},
        "data": {"k": "v"},
    }


def trainjob(name: str, ns: str = "default") -> dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"runtimeRef": {"name": "torch-distributed"}, "trainer": {"numNodes": 1}},
    }


def running_pod(name: str, ns: str = "default", containers: tuple[str, ...] = ("node",)) -> dict[str, Any]:
    """A pod as a kubelet would show it running (written straight into the store in tests)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"nodeName": "node-1", "containers": [{"name": c, "image": "busybox"} for c in containers]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": c,
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}},
                }
                for c in containers
            ],
        },
    }
