"""docs/kubeflow-python.md: every Python block runs, in order, in one namespace, against kubesim.

The page's blocks use top-level ``await`` (as in ``python -m asyncio``). The working directory holds
``kubesim.kubeconfig`` for this module's simulator. To keep the suite fast, the store the page uses
(``jobs.db``) already holds probe findings for this cluster (probed here with a short window), so the
page's writable opens reuse them — which is what section 5 documents.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
from kubeflow_fixtures import kubeconfig

from dispatch import AdapterConfig, SqliteStore, StoreProbeCache
from dispatch_kubeflow.backend import open_backend
from kubesim.sim import Simulator

pytestmark = pytest.mark.asyncio(loop_scope="module")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "kubeflow-python.md"


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)


async def test_every_block_runs_in_order(
    sim: Simulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    kubeconfig(tmp_path / "kubesim.kubeconfig", sim.url, sim.token("admin"))
    store = SqliteStore(tmp_path / "jobs.db")
    settings = json.dumps({"kubeconfig": "kubesim.kubeconfig"}).encode()
    seeded = await open_backend(
        AdapterConfig("kubeflow", settings, probe_cache=StoreProbeCache(store)), probe_window=0.3
    )
    await seeded.close()
    await store.close()
    blocks = _blocks()
    assert len(blocks) >= 10
    namespace: dict[str, object] = {"__name__": "__doc__"}
    for i, block in enumerate(blocks):
        code = compile(block, f"{PAGE.name}[{i}]", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        result = eval(code, namespace)
        if result is not None:
            await result
    out = capsys.readouterr().out
    assert "read_write ['dispatch/Image', 'kubeflow/RuntimeRef']" in out
    assert "kubeflow read_only" in out
    assert "team-a 10.0 3600.0 50" in out
    assert out.count("True") >= 2
    assert "was not found" in out and "checkpoint" in out
    assert "s3cr3t" not in out
