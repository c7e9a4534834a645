"""The architecture of SPEC §1, checked on the source: which package may import which."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _modules(package: str) -> list[Path]:
    return sorted((SRC / package).rglob("*.py"))


def _top(name: str) -> str:
    return name.split(".")[0]


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("dispatch", {"dispatch_kubeflow", "kubesim"}),
        ("kubesim", {"dispatch", "dispatch_kubeflow"}),
        ("dispatch_kubeflow", {"kubesim"}),
    ],
)
def test_packages_import_only_what_the_layout_allows(package: str, forbidden: set[str]) -> None:
    offenders = [
        f"{path.relative_to(SRC)} imports {name}"
        for path in _modules(package)
        for name in _imports(path)
        if _top(name) in forbidden
    ]
    assert offenders == []


def test_model_imports_nothing_of_dispatch_but_errors() -> None:
    offenders = [
        f"{path.relative_to(SRC)} imports {name}"
        for path in _modules("dispatch/model")
        for name in _imports(path)
        if _top(name) == "dispatch" and not (name == "dispatch.errors" or name.startswith("dispatch.model"))
    ]
    assert offenders == []
