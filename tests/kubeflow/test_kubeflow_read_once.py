"""A read-only backend's first read lists once and opens no watch (a command that asks once); its next
read, and every read of a backend that may write, follows the cluster with list+watch. Counted on
kubesim's request log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kubeflow_fixtures import config, ident, kubeconfig, spec

from dispatch.backend import place
from dispatch_kubeflow.backend import open_backend
from kubesim.sim import Simulator

pytestmark = pytest.mark.asyncio(loop_scope="module")


def _since(sim: Simulator, before: int, identity: str) -> list[tuple[str, str]]:
    return [(r.verb, r.resource) for r in list(sim.requests)[before:] if r.identity == identity]


async def _watching(sim: Simulator, before: int, identity: str) -> set[str]:
    """The resources this identity opened a watch on since ``before``, once the streams' tasks ran."""
    for _ in range(200):
        found = {res for verb, res in _since(sim, before, identity) if verb == "watch"}
        if found:
            return found
        await asyncio.sleep(0.01)
    return set()


async def test_a_read_only_first_read_lists_once_and_watches_nothing(sim: Simulator, tmp_path: Path) -> None:
    writer = await open_backend(
        config({"kubeconfig": kubeconfig(tmp_path / "w", sim.url, sim.token("admin"))}), probe_window=0.3
    )
    try:
        handle = await place(writer, spec(), ident("read-once"))
    finally:
        await writer.close()
    kc = kubeconfig(tmp_path / "r", sim.url, sim.token("readonly"))
    reader = await open_backend(config({"kubeconfig": kc}, read_only=True))
    try:
        before = len(list(sim.requests))
        obs = await reader.observe(handle)
        assert obs.handle == handle
        first = _since(sim, before, "readonly")
        assert ("watch" not in {verb for verb, _ in first}) and {res for _, res in first} >= {
            "trainjobs",
            "jobsets",
            "jobs",
            "pods",
        }
        assert not {"trainingruntimes", "clustertrainingruntimes"} & {res for _, res in first}
        before = len(list(sim.requests))
        await reader.list()  # the second read starts the feed
        assert "trainjobs" in await _watching(sim, before, "readonly")
    finally:
        await reader.close()


async def test_a_backend_that_may_write_watches_from_its_first_read(sim: Simulator, tmp_path: Path) -> None:
    kc = kubeconfig(tmp_path / "w", sim.url, sim.token("admin"))
    b = await open_backend(config({"kubeconfig": kc}), probe_window=0.3)
    try:
        before = len(list(sim.requests))
        await b.list()
        assert "trainjobs" in await _watching(sim, before, "admin")
    finally:
        await b.close()
