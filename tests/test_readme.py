"""The README's promises: its Python tour runs as written, and CI runs exactly its test command."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_the_tour_runs_as_written(tmp_path: Path) -> None:
    code = re.search(r"```python\n(.*?)```", README, re.S)
    assert code is not None, "the README has a Python tour"
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = {"PATH": "", "DISPATCH_STATE_DIR": str(tmp_path / "state"), "HOME": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", code.group(1)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "failed (out_of_memory)" in done.stdout
    assert (tmp_path / "jobs.db").exists()


def test_ci_runs_exactly_the_readme_test_command() -> None:
    commands = re.search(r"```sh\n(.*?)```", README, re.S)
    assert commands is not None
    lines = commands.group(1).strip().splitlines()
    assert len(lines) == 2, "the README opens with two commands: quick start, tests"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert lines[1] in ci
