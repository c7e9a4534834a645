"""The architecture of SPEC §1, checked on the source: which package may import which.

Every way a module names another counts: ``import x``, ``from x import y``, relative imports
(``from ..kubesim import y`` resolved against the module's own package), and ``importlib.import_module``
/ ``__import__`` called with a literal name (absolute, or relative with its ``package=`` literal).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"

RULES = {
    "dispatch": {"dispatch_kubeflow", "dispatch_slurm", "kubesim"},
    "kubesim": {"dispatch", "dispatch_kubeflow", "dispatch_slurm"},
    "dispatch_kubeflow": {"dispatch_slurm", "kubesim"},
    "dispatch_slurm": {"dispatch_kubeflow", "kubesim"},
    # The behaviour-script grammar both dispatch (memory adapter) and kubesim read: a leaf.
    "kubescript": {"dispatch", "dispatch_kubeflow", "dispatch_slurm", "kubesim"},
}


def _package_of(path: Path) -> str:
    """The dotted package a source file belongs to (``src/a/b/c.py`` -> ``a.b``)."""
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1])  # a module's package, or the package an __init__ is


def _resolve(name: str, level: int, package: str) -> str:
    if level == 0:
        return name
    base = package.split(".")
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join([*base, name] if name else base)


def imports_of(source: str, package: str) -> set[str]:
    """Every module ``source`` (a module of ``package``) imports, by any of the ways above."""
    tree = ast.parse(source)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = _resolve(node.module or "", node.level, package)
            found.add(module)
            if node.module is None:  # `from . import x`: x may be a module of that package
                found.update(f"{module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Call):
            func = node.func
            callee = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            if callee not in ("import_module", "__import__") or not node.args:
                continue
            first = node.args[0]
            if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
                continue
            name = first.value
            if name.startswith("."):
                pkg = next(
                    (
                        k.value.value
                        for k in node.keywords
                        if k.arg == "package"
                        and isinstance(k.value, ast.Constant)
                        and isinstance(k.value.value, str)
                    ),
                    package,
                )
                level = len(name) - len(name.lstrip("."))
                name = _resolve(name.lstrip("."), level, pkg)
            found.add(name)
    return found


def _imports(path: Path) -> set[str]:
    return imports_of(path.read_text(), _package_of(path))


def _modules(package: str) -> list[Path]:
    return sorted((SRC / package).rglob("*.py"))


def _top(name: str) -> str:
    return name.split(".")[0]


def test_every_top_level_package_has_a_rule() -> None:
    packages = {p.name for p in SRC.iterdir() if (p / "__init__.py").exists()}
    assert packages == set(RULES)


def test_the_architecture_page_tables_the_same_rules() -> None:
    """docs/architecture.md's package table says, for every package, what it may import: exactly the
    packages :data:`RULES` does not forbid it."""
    page = (SRC.parent / "docs" / "architecture.md").read_text()
    table = page.split("<!-- packages -->", 1)[1].split("<!-- /packages -->", 1)[0]
    rows = [line.split("|") for line in table.strip().splitlines()[2:]]
    documented = {
        cells[1].strip().strip("`"): {
            name.strip().strip("`") for name in cells[3].split(",") if name.strip() != "nothing"
        }
        for cells in rows
    }
    derived = {pkg: set(RULES) - forbidden - {pkg} for pkg, forbidden in RULES.items()}
    assert documented == derived


@pytest.mark.parametrize(("package", "forbidden"), sorted(RULES.items()))
def test_packages_import_only_what_the_layout_allows(package: str, forbidden: set[str]) -> None:
    offenders = [
        f"{path.relative_to(SRC)} imports {name}"
        for path in _modules(package)
        for name in _imports(path)
        if _top(name) in forbidden
    ]
    assert offenders == []


def test_the_script_grammar_has_one_implementation() -> None:
    """dispatch's memory adapter and kubesim both read kubescript's parser; neither has its own."""
    assert "kubescript" in _imports(SRC / "dispatch" / "memory" / "script.py")
    assert "kubescript" in _imports(SRC / "kubesim" / "behaviour.py")
    for path in (SRC / "dispatch" / "memory" / "script.py", SRC / "kubesim" / "behaviour.py"):
        defined = {
            n.name
            for n in ast.walk(ast.parse(path.read_text()))
            if isinstance(n, ast.FunctionDef | ast.ClassDef)
        }
        assert not defined & {"_parse_step", "_parse_guards", "Guard", "Step", "plan_rank", "render_text"}, (
            path
        )


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
    "dispatch/cli/selectors.py",
    "dispatch/fold.py",
    "dispatch/model",
    "dispatch/tally.py",
    "dispatch/memory/naming.py",
    "dispatch/memory/script.py",
    "dispatch/ui/pages.py",
    "dispatch/ui/timeline.py",
    "dispatch_kubeflow/causes.py",
    "dispatch_kubeflow/events.py",
    "dispatch_kubeflow/names.py",
    "dispatch_kubeflow/naming.py",
    "dispatch_kubeflow/objects.py",
    "dispatch_kubeflow/resources.py",
    "dispatch_kubeflow/runtime.py",
    "dispatch_kubeflow/settings.py",
    "dispatch_kubeflow/trainer_schema.py",
    "dispatch_kubeflow/trainjob.py",
    "dispatch_slurm/answers.py",
    "dispatch_slurm/behaviour.py",
    "dispatch_slurm/causes.py",
    "dispatch_slurm/naming.py",
    "dispatch_slurm/reader.py",
    "dispatch_slurm/script.py",
    "dispatch_slurm/settings.py",
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
        "dispatch_slurm.transport",
        "dispatch_slurm.backend",
        "dispatch_slurm.localslurm",
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

    local = {"dispatch", "dispatch_kubeflow", "kubesim", "kubescript"}
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
    """The adapter speaks HTTP with its own client, which only dispatch_kubeflow.kube imports (and so the
    one module that catches its errors); no module imports a third-party HTTP or Kubernetes library."""
    offenders = [
        f"{path.relative_to(SRC)} imports {name}"
        for path in _modules("dispatch_kubeflow")
        for name in _imports(path)
        if _top(name) in {"httpx", "httpx2", "httpcore", "httpcore2", "lightkube", "aiohttp"}
        or (name == "dispatch_kubeflow.http" and path.name not in ("kube.py", "http.py"))
    ]
    assert offenders == []


@pytest.mark.parametrize(
    ("source", "package", "expected"),
    [
        ("from ..kubesim import sim", "dispatch.memory", "dispatch.kubesim"),
        ("from ..cluster import Cluster", "dispatch.model", "dispatch.cluster"),
        ("from ... import kubesim", "dispatch.memory.x", "dispatch.kubesim"),
        ("from . import kubesim", "dispatch", "dispatch.kubesim"),
        ("import importlib\nimportlib.import_module('kubesim.sim')", "dispatch", "kubesim.sim"),
        ("from importlib import import_module as im\nimport_module('kubesim')", "dispatch", "kubesim"),
        ("__import__('dispatch_kubeflow')", "kubesim", "dispatch_kubeflow"),
        ("import importlib\nimportlib.import_module('.sim', package='kubesim')", "dispatch", "kubesim.sim"),
        ("def f():\n    import kubesim.sim as s\n    return s", "dispatch", "kubesim.sim"),
    ],
)
def test_the_checker_sees_every_kind_of_import(source: str, package: str, expected: str) -> None:
    assert expected in imports_of(source, package)
