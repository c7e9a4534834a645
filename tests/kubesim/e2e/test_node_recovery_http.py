"""Nodes that come back, seen over real HTTP: a lost node's machine reboots (the node lifecycle
controller untaints it once Ready) or an autoscaler replaces it (PodGC takes its pods, a new Node
registers), and a node patched Ready by hand runs its pods again."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from kubesim import Simulator
from kubesim.controllers.noderecovery import replacement_name

from .conftest import call

NS = "default"


def ready(node: dict[str, Any]) -> str:
    (c,) = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    return str(c["status"])


def taint_keys(node: dict[str, Any]) -> set[str]:
    return {t["key"] for t in (node.get("spec") or {}).get("taints") or []}


def pod(name: str, node: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "node",
                    "image": "registry.example.com/x:1",
                    "env": [{"name": "KUBESIM_SCRIPT", "value": "hang"}],
                }
            ],
        },
    }


async def node_events(sim: Simulator, reason: str) -> list[str]:
    code, body = await call(sim, "GET", f"/api/v1/namespaces/{NS}/events", fieldSelector=f"reason={reason}")
    assert code == 200, body
    return [e["involvedObject"]["name"] for e in body["items"]]


@pytest.fixture
async def replacing() -> AsyncIterator[Simulator]:
    async with Simulator(node_recovery="replace", node_recovery_after=60) as s:
        yield s


async def test_an_autoscaler_replaces_a_lost_node(replacing: Simulator) -> None:
    sim = replacing
    code, body = await call(sim, "POST", f"/api/v1/namespaces/{NS}/pods", pod("on-1", "node-1"))
    assert code == 201, body
    await sim.settle()
    sim.actions.lose_node("node-1")
    sim.advance(59)
    code, node = await call(sim, "GET", "/api/v1/nodes/node-1")
    assert (code, ready(node)) == (200, "Unknown")
    assert "node.kubernetes.io/unreachable" in taint_keys(node)
    sim.advance(2)
    code, _ = await call(sim, "GET", "/api/v1/nodes/node-1")
    assert code == 404
    code, node = await call(sim, "GET", "/api/v1/nodes/node-4")
    assert (code, ready(node), taint_keys(node)) == (200, "True", set())
    assert node["status"]["capacity"]["nvidia.com/gpu"] == "4"
    # PodGC took the pod bound to the vanished node at once (no grace period left to wait for).
    code, _ = await call(sim, "GET", f"/api/v1/namespaces/{NS}/pods/on-1")
    assert code == 404
    assert "node-4" in await node_events(sim, "RegisteredNode")
    # The new node takes work.
    code, body = await call(sim, "POST", f"/api/v1/namespaces/{NS}/pods", pod("on-4", "node-4"))
    assert code == 201, body
    await sim.settle()
    code, body = await call(sim, "GET", f"/api/v1/namespaces/{NS}/pods/on-4")
    assert body["status"]["phase"] == "Running"


async def test_a_rebooted_node_is_untainted_and_runs_again() -> None:
    async with Simulator(node_recovery="reboot", node_recovery_after=120) as sim:
        sim.actions.lose_node("node-2")
        code, body = await call(sim, "POST", f"/api/v1/namespaces/{NS}/pods", pod("waits", "node-2"))
        assert code == 201, body
        sim.advance(60)
        code, body = await call(sim, "GET", f"/api/v1/namespaces/{NS}/pods/waits")
        assert body["status"]["conditions"][0]["reason"] == "Unschedulable"
        sim.advance(61)
        code, node = await call(sim, "GET", "/api/v1/nodes/node-2")
        assert (ready(node), taint_keys(node)) == ("True", set())
        assert "node-2" in await node_events(sim, "NodeReady")
        code, body = await call(sim, "GET", f"/api/v1/namespaces/{NS}/pods/waits")
        assert body["status"]["phase"] == "Running"


async def test_a_node_patched_ready_by_hand_is_untainted_and_its_kubelet_resumes() -> None:
    async with Simulator() as sim:  # no recovery: the node stays lost until someone says otherwise
        sim.actions.lose_node("node-3")
        sim.advance(600)
        code, node = await call(sim, "GET", "/api/v1/nodes/node-3")
        assert ready(node) == "Unknown"
        conditions = [
            dict(c, status="True", reason="KubeletReady") if c["type"] == "Ready" else c
            for c in node["status"]["conditions"]
        ]
        code, body = await call(
            sim,
            "PATCH",
            "/api/v1/nodes/node-3/status",
            {"status": {"conditions": conditions}},
            ctype="application/merge-patch+json",
        )
        assert code == 200, body
        await sim.settle()
        code, node = await call(sim, "GET", "/api/v1/nodes/node-3")
        assert taint_keys(node) == set()
        code, body = await call(sim, "POST", f"/api/v1/namespaces/{NS}/pods", pod("back", "node-3"))
        assert code == 201, body
        await sim.settle()
        code, body = await call(sim, "GET", f"/api/v1/namespaces/{NS}/pods/back")
        assert body["status"]["phase"] == "Running"


def test_replacement_names() -> None:
    assert replacement_name("node-1", ["node-0", "node-1", "node-2", "node-3"]) == "node-4"
    assert replacement_name("node-4", ["node-0", "node-4", "node-9x"]) == "node-5"
    assert replacement_name("gpu", ["gpu", "cpu-1"]) == "gpu-1"


async def test_bad_recovery_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="'reboot' or 'replace'"):
        Simulator(node_recovery="melt")
    with pytest.raises(ValueError, match=">= 0 seconds"):
        Simulator(node_recovery="reboot", node_recovery_after=-1)
