"""Where the page's browser tests leave their screenshots: ``$DISPATCH_ARTIFACTS/ui``, by default
``tests-artifacts/ui`` (git-ignored). The run's summary says where, when any were written."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

ARTIFACTS = (
    Path(os.environ.get("DISPATCH_ARTIFACTS") or Path(__file__).resolve().parents[2] / "tests-artifacts")
    / "ui"
)
_written: list[Path] = []


@pytest.fixture(scope="module")
def artifacts() -> Path:
    """A fresh screenshot directory (for this run's pictures only)."""
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)
    _written.append(ARTIFACTS)
    return ARTIFACTS


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _written:
        shots = sorted(p.name for p in ARTIFACTS.glob("*.png"))
        terminalreporter.write_line(f"ui screenshots ({len(shots)}): {ARTIFACTS} ({', '.join(shots)})")
