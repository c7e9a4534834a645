"""docs/tutorial.md, run exactly as written: every ``$`` line of its console blocks, in order, in a fresh
home directory with ``$XDG_STATE_HOME`` set elsewhere (as many people's is: a tutorial that wrote
``~/.local/state/dispatch`` instead of asking dispatch would fail), with the files its ``<!-- file: -->``
blocks show. A trailing ``# exit N`` says the exit code the tutorial expects (default 0). A block marked
``<!-- needs: supervise -->`` runs only when this dispatch has the supervisor. A block marked
``<!-- meanwhile -->`` runs beside the next one, as in a second terminal: its commands start in the
background, the next block runs once each has printed its first line, and they must then end as expected."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from dispatch import AdapterConfig, SqliteStore, StoreProbeCache
from dispatch_kubeflow.backend import open_backend

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PAGE = ROOT / "docs" / "tutorial.md"


def _steps() -> list[tuple[str, str, str]]:
    """(kind, marker, body) for each console block and file block, in page order; a console block's
    marker is the command it needs, or ``meanwhile``."""
    text = PAGE.read_text()
    out = []
    for m in re.finditer(r"(<!-- (\w+):? ?([^>]*?) -->\n)?```(console|yaml)\n(.*?)```", text, re.S):
        marker_kind, marker_value, lang, body = m.group(2) or "", m.group(3) or "", m.group(4), m.group(5)
        if lang == "console":
            out.append(("console", marker_value if marker_kind == "needs" else marker_kind, body))
        elif marker_kind == "file":
            out.append(("file", marker_value, body))
    return out


def _commands(body: str) -> list[tuple[str, int]]:
    """The ``$`` lines of a console block with the exit code each is expected to end with."""
    out = []
    for line in body.splitlines():
        if line.startswith("$ "):
            expected = re.search(r"#\s*exit (\d+)\s*$", line)
            out.append((line[2:], int(expected.group(1)) if expected else 0))
    return out


class Meanwhile:
    """A command of a ``meanwhile`` block, running in the background; its output read as it comes."""

    def __init__(self, command: str, want: int, cwd: Path, env: dict[str, str]) -> None:
        self.command, self.want = command, want
        self.proc = subprocess.Popen(
            ["bash", "-c", command],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stdout: list[str] = []
        self.started = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout.append(line)
            self.started.set()
        self.started.set()

    def finish(self) -> None:
        assert self.proc.stderr is not None
        stderr = self.proc.stderr.read()
        code = self.proc.wait(timeout=300)
        self.reader.join(timeout=60)
        out = "".join(self.stdout)
        assert code == self.want, f"$ {self.command} (meanwhile)\n{out}\n{stderr}"
        assert "Traceback" not in stderr, stderr


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
    meanwhile: list[Meanwhile] = []
    try:
        _start_with_probe_findings(env, home)
        for kind, marker, body in _steps():
            if kind == "file":
                (work / marker).write_text(body)
                continue
            if marker == "meanwhile":
                for command, want in _commands(body):
                    meanwhile.append(Meanwhile(command, want, work, env))
                    assert meanwhile[-1].started.wait(timeout=120), f"$ {command} printed nothing"
                    ran += 1
                continue
            if marker and not re.search(rf"^\s+{re.escape(marker)}\b", helptext, re.M):
                skipped += 1
                continue
            for command, want in _commands(body):
                done = subprocess.run(
                    ["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, timeout=120
                )
                assert done.returncode == want, f"$ {command}\n{done.stdout}\n{done.stderr}"
                assert "Traceback" not in done.stderr, done.stderr
                ran += 1
            while meanwhile:  # the block that ran beside them is done: so must they be
                meanwhile.pop(0).finish()
    finally:
        for m in meanwhile:
            m.proc.kill()
        subprocess.run(["dispatch", "dev-cluster", "stop"], env=env, capture_output=True, timeout=60)
        if (work / ".slurm").is_dir():  # the tutorial's own Slurm, when a step failed before its stop line
            stop = [sys.executable, "-m", "dispatch_slurm.localslurm", "stop", ".slurm"]
            subprocess.run(stop, cwd=work, env=env, capture_output=True, timeout=60)
    assert ran >= 15 and skipped <= 1
