"""docs/conformance.md's test module works as written outside the repository: a plain
``@pytest.fixture``, pytest-asyncio in its default (strict) mode, no conftest and no configuration."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_documented_conformance_module_runs_as_written(tmp_path: Path) -> None:
    module = re.search(r"```python\n(.*?)```", (ROOT / "docs" / "conformance.md").read_text(), re.S)
    assert module is not None
    text = module.group(1)
    assert "from myadapter.testing import MyHarness" in text
    # The reference harness stands for the author's own.
    text = text.replace(
        "from myadapter.testing import MyHarness",
        "from dispatch.conformance import MemoryHarness as MyHarness",
    )
    (tmp_path / "test_myadapter_conformance.py").write_text(text)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_myadapter_conformance.py"],
        cwd=tmp_path,  # no pyproject, pytest.ini or conftest: pytest-asyncio's defaults
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert re.search(r"\b2[0-9] passed", done.stdout), done.stdout[-500:]
    assert "error" not in done.stdout.lower().split("passed")[-1], done.stdout[-500:]
