"""docs/tutorial.md, run exactly as written: every ``$`` line of its console blocks, in order, in a fresh
home directory with ``$XDG_STATE_HOME`` set elsewhere (as many people's is: a tutorial that wrote
``~/.local/state/dispatch`` instead of asking dispatch would fail), with the files its ``<!-- file: -->``
blocks show. A trailing ``# exit N`` says the exit code the tutorial expects (default 0). A block marked
``<!-- needs: supervise -->`` runs only when this dispatch has the supervisor."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dispatch import AdapterConfig, SqliteStore, StoreProbeCache
from dispatch_kubeflow.backend import open_backend

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PAGE = ROOT / "docs" / "tutorial.md"


def _steps() -> list[tuple[str, str, str]]:
    """(kind, marker, body) for each console block and file block, in page order."""
    text = PAGE.read_text()
    out = []
    for m in re.finditer(r"(<!-- (\w+): ?([^>]*?) -->\n)?```(console|yaml)\n(.*?)```", text, re.S):
        marker_kind, marker_value, lang, body = m.group(2) or "", m.group(3) or "", m.group(4), m.group(5)
        if lang == "console":
            out.append(("console", marker_value if marker_kind == "needs" else "", body))
        elif marker_kind == "file":
            out.append(("file", marker_value, body))
    return out


def _start_with_probe_findings(env: dict[str, str], home: Path) -> None:
    """Start the dev cluster and keep probe findings in the store (probed with a 3 s window), so the
    tutorial's first command skips the ≥ 10 s probe: the first-run experience, probe included, is
    tests/cli/test_embedded.py's; this test is about the commands."""
    subprocess.run(["dispatch", "dev-cluster", "start"], env=env, check=True, capture_output=True, timeout=60)
    state = Path(env["XDG_STATE_HOME"]) / "dispatch"

    async def seed() -> None:
        store = SqliteStore(state / "jobs.db")
        settings = json.dumps({"kubeconfig": str(state / "dev-cluster" / "kubeconfig")}).encode()
        try:
            backend = await open_backend(
                AdapterConfig("kubeflow", settings, probe_cache=StoreProbeCache(store)), probe_window=3.0
            )
            # The window must let the probe's pods appear: findings saying pods are not visible would
            # keep the adapter from watching pods, and the tutorial's preemption would read `unknown`.
            assert backend.facts.pods_visible is True, backend.facts
            await backend.close()
        finally:
            await store.close()

    asyncio.run(seed())


@pytest.mark.timeout(600)
def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir()
    shutil.copytree(ROOT / "examples", work / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DISPATCH_", "XDG_", "KUBECONFIG"))}
    env.update(HOME=str(home), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    env["XDG_STATE_HOME"] = str(tmp_path / "state-elsewhere")
    helptext = subprocess.run(["dispatch", "--help"], env=env, capture_output=True, text=True).stdout
    ran = skipped = 0
    try:
        _start_with_probe_findings(env, home)
        for kind, marker, body in _steps():
            if kind == "file":
                (work / marker).write_text(body)
                continue
            if marker and not re.search(rf"^\s+{re.escape(marker)}\b", helptext, re.M):
                skipped += 1
                continue
            for line in body.splitlines():
                if not line.startswith("$ "):
                    continue
                command = line[2:]
                expected = re.search(r"#\s*exit (\d+)\s*$", command)
                done = subprocess.run(
                    ["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=120
                )
                want = int(expected.group(1)) if expected else 0
                assert done.returncode == want, f"$ {command}\n{done.stdout}\n{done.stderr}"
                assert "Traceback" not in done.stderr, done.stderr
                ran += 1
    finally:
        subprocess.run(["dispatch", "dev-cluster", "stop"], env=env, capture_output=True, timeout=60)
        if (work / ".slurm").is_dir():  # the tutorial's own Slurm, when a step failed before its stop line
            stop = [sys.executable, "-m", "dispatch_slurm.localslurm", "stop", ".slurm"]
            subprocess.run(stop, cwd=work, env=env, capture_output=True, timeout=60)
    assert ran >= 15 and skipped <= 1
