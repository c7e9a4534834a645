"""The Python API as the README shows it: its examples are clean under ``mypy --strict``, and the
synchronous facade (``dispatch.sync``) works in a real Jupyter kernel, where an event loop already runs
(and ``asyncio.run`` cannot)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_the_readme_has_the_async_tour_and_the_sync_example() -> None:
    assert len(BLOCKS) == 2 and "asyncio.run" in BLOCKS[0] and "dispatch.sync.open" in BLOCKS[1]


@pytest.mark.parametrize("index", [0, 1], ids=["async tour", "sync facade"])
def test_the_readme_examples_are_clean_under_mypy_strict(index: int, tmp_path: Path) -> None:
    example = tmp_path / "example.py"
    example.write_text(BLOCKS[index])
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-incremental", str(example)],
        cwd=tmp_path,  # not the checkout: the installed dispatch, as a user has it
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_readme_examples_are_clean_under_pyright(tmp_path: Path) -> None:
    for index, block in enumerate(BLOCKS):
        (tmp_path / f"example{index}.py").write_text(block)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pyright",
            "--pythonpath",
            sys.executable,
            *sorted(str(p) for p in tmp_path.glob("*.py")),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 errors" in done.stdout


@pytest.mark.timeout(300)
def test_the_sync_facade_works_in_a_jupyter_kernel(tmp_path: Path) -> None:
    probe = "import asyncio\ntry:\n    asyncio.get_running_loop()\n    print('a loop runs')\nexcept RuntimeError:\n    print('no loop')\n"
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(probe), nbformat.v4.new_code_cell(BLOCKS[1])]
    )
    NotebookClient(
        nb, kernel_name="python3", timeout=120, resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    loop_cell, example_cell = nb.cells
    assert loop_cell.outputs[0]["text"].strip() == "a loop runs"  # as in every notebook: asyncio.run fails
    printed = "".join(o.get("text", "") for o in example_cell.outputs)
    assert not [o for o in example_cell.outputs if o["output_type"] == "error"], example_cell.outputs
    assert printed.strip().splitlines()[-1] == "succeeded"
