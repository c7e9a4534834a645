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


# The modules that decide (SPEC's "pure functions for what decides"): no I/O, no clock, no event loop.
# docs/architecture.md lists the same modules; test_architecture_page_lists_the_pure_modules keeps them equal.
PURE = (
    "dispatch/fold.py",
    "dispatch/model",
    "dispatch/memory/naming.py",
    "dispatch/memory/script.py",
    "dispatch_kubeflow/causes.py",
    "dispatch_kubeflow/names.py",
    "dispatch_kubeflow/naming.py",
    "dispatch_kubeflow/resources.py",
    "dispatch_kubeflow/runtime.py",
    "dispatch_kubeflow/settings.py",
    "dispatch_kubeflow/trainer_schema.py",
    "dispatch_kubeflow/trainjob.py",
    "kubesim/controllers/trainjob_build.py",
    "kubesim/patch.py",
    "kubesim/selectors.py",
)
IO_MODULES = frozenset(
    {
        "asyncio",
        "socket",
        "ssl",
        "select",
        "selectors",
        "subprocess",
        "threading",
        "multiprocessing",
        "sqlite3",
        "time",
        "os",
        "io",
        "shutil",
        "tempfile",
        "pathlib",
        "urllib",
        "http",
        "logging",
        "aiohttp",
        "httpx",
        "httpx2",
        "httpcore",
        "lightkube",
        "psycopg",
        "psycopg_pool",
        "dispatch.clock",
        "dispatch.records",
        "dispatch.cluster",
        "dispatch_kubeflow.kube",
        "dispatch_kubeflow.backend",
        "kubesim.store",
        "kubesim.server",
    }
)


def _pure_files() -> list[Path]:
    out: list[Path] = []
    for entry in PURE:
        path = SRC / entry
        assert path.exists(), f"{entry} is listed as pure but does not exist"
        out += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return out


def test_pure_modules_do_no_io() -> None:
    offenders = [
        f"{path.relative_to(SRC)} imports {name}"
        for path in _pure_files()
        for name in _imports(path)
        if name in IO_MODULES or _top(name) in IO_MODULES or any(name.startswith(m + ".") for m in IO_MODULES)
    ]
    assert offenders == []


def test_architecture_page_lists_the_pure_modules() -> None:
    page = (SRC.parent / "docs" / "architecture.md").read_text()
    start = page.index("<!-- pure modules -->")
    end = page.index("<!-- /pure modules -->")
    listed = sorted(line.strip("- `\n") for line in page[start:end].splitlines()[1:] if line.startswith("- "))
    assert listed == sorted(PURE)


def _declared_dependencies() -> set[str]:
    import re
    import tomllib

    project = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["project"]
    # Optional ones count: dispatch.conformance is pytest checks, for whoever installs pytest to run them.
    deps = list(project["dependencies"]) + [
        d for extra in project["optional-dependencies"].values() for d in extra
    ]
    names = {re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].strip().lower() for d in deps}
    return {n.replace("-", "_") for n in names}


# Import name -> distribution name, where they differ.
_DISTRIBUTIONS = {"yaml": "pyyaml"}


def test_every_third_party_package_imported_is_declared() -> None:
    """A package imported directly must be a declared dependency, not something another one happens to pull in."""
    import sys

    local = {"dispatch", "dispatch_kubeflow", "kubesim"}
    declared = _declared_dependencies()
    missing = sorted(
        {
            f"{path.relative_to(SRC)} imports {name}"
            for package in sorted(local)
            for path in _modules(package)
            for name in _imports(path)
            if _top(name) not in local
            and _top(name) not in sys.stdlib_module_names
            and _DISTRIBUTIONS.get(_top(name), _top(name)) not in declared
        }
    )
    assert missing == []


def test_only_the_kubernetes_layer_talks_http() -> None:
    """dispatch_kubeflow.kube is the one module that imports the HTTP client or lightkube (and so the one
    that can catch their errors); the others see dispatch's errors only."""
    offenders = [
        f"{path.relative_to(SRC)} imports {name}"
        for path in _modules("dispatch_kubeflow")
        for name in _imports(path)
        if _top(name) in {"httpx", "httpx2", "httpcore", "httpcore2", "lightkube", "aiohttp"}
        and path.name != "kube.py"
    ]
    assert offenders == []
