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


def _package_table(text: str, marker: str) -> dict[str, tuple[str, set[str]]]:
    """A table of packages between ``<!-- marker -->`` and ``<!-- /marker -->``: package -> (what lives
    there, what it may import)."""
    table = text.split(f"<!-- {marker} -->", 1)[1].split(f"<!-- /{marker} -->", 1)[0]
    rows = [line.split("|") for line in table.strip().splitlines()[2:]]
    return {
        cells[1].strip().strip("`"): (
            cells[2],
            {name.strip().strip("`") for name in cells[3].split(",") if name.strip() != "nothing"},
        )
        for cells in rows
    }


DERIVED = {pkg: set(RULES) - forbidden - {pkg} for pkg, forbidden in RULES.items()}
"""What each package may import: every package :data:`RULES` does not forbid it."""


def test_the_architecture_page_tables_the_same_rules() -> None:
    """docs/architecture.md's package table says, for every package, what it may import: exactly the
    packages :data:`RULES` does not forbid it."""
    page = (SRC.parent / "docs" / "architecture.md").read_text()
    documented = {pkg: imports for pkg, (_, imports) in _package_table(page, "packages").items()}
    assert documented == DERIVED


def test_the_readme_tables_every_package_and_the_same_rules() -> None:
    """The README's layout table: a row per package, each with what it may import (as :data:`RULES`
    derives it), the host's naming its CLI and its page."""
    readme = (SRC.parent / "README.md").read_text()
    rows = _package_table(readme, "layout")
    assert {pkg: imports for pkg, (_, imports) in rows.items()} == DERIVED
    assert "`dispatch.ui`" in rows["dispatch"][0] and "`dispatch.cli`" in rows["dispatch"][0]


def test_the_readme_lists_every_command() -> None:
    """The README's CLI line names every command of ``dispatch --help``, and no other."""
    import re

    from dispatch.cli.commands import cli

    readme = (SRC.parent / "README.md").read_text()
    line = readme.split("- **The CLI** (`dispatch --help`):", 1)[1].split("([docs/cli.md]", 1)[0]
    assert sorted(re.findall(r"`([a-z-]+)`", line)) == sorted(cli.commands)


def test_the_architecture_page_names_every_backend_protocol() -> None:
    """docs/architecture.md names each protocol of ``dispatch.backend`` an adapter may implement."""
    tree = ast.parse((SRC / "dispatch" / "backend.py").read_text())
    protocols = {
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and any(isinstance(b, ast.Name) and b.id == "Protocol" for b in node.bases)
    }
    page = (SRC.parent / "docs" / "architecture.md").read_text()
    assert protocols and sorted(p for p in protocols if f"`{p}`" not in page) == []


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
    "dispatch/decide.py",
    "dispatch/execlimits.py",
    "dispatch/fold.py",
    "dispatch/model",
    "dispatch/tally.py",
    "dispatch/memory/jobs.py",
    "dispatch/memory/naming.py",
    "dispatch/memory/script.py",
    "dispatch/supervise/decisions.py",
    "dispatch/ui/pages.py",
    "dispatch/ui/timeline.py",
    "dispatch_kubeflow/causes.py",
    "dispatch_kubeflow/events.py",
    "dispatch_kubeflow/names.py",
    "dispatch_kubeflow/naming.py",
    "dispatch_kubeflow/objects.py",
    "dispatch_kubeflow/plain.py",
    "dispatch_kubeflow/protobuf.py",
    "dispatch_kubeflow/resources.py",
    "dispatch_kubeflow/runtime.py",
    "dispatch_kubeflow/settings.py",
    "dispatch_kubeflow/trainer_schema.py",
    "dispatch_kubeflow/trainjob.py",
    "dispatch_slurm/answers.py",
    "dispatch_slurm/behaviour.py",
    "dispatch_slurm/causes.py",
    "dispatch_slurm/clusterconf.py",
    "dispatch_slurm/naming.py",
    "dispatch_slurm/reader.py",
    "dispatch_slurm/readings.py",
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


def _cli_graph() -> dict[str, set[str]]:
    """Which module of ``dispatch.cli`` imports which (``from dispatch.cli import x`` naming module ``x``).
    The package's ``__init__`` is left out: it loads the commands only when ``main`` runs."""
    cli = SRC / "dispatch" / "cli"
    names = {p.stem for p in cli.glob("*.py")} - {"__init__", "__main__"}
    graph: dict[str, set[str]] = {}
    for name in names:
        tree = ast.parse((cli / f"{name}.py").read_text())
        found: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "dispatch.cli":
                found.update(a.name for a in node.names if a.name in names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dispatch.cli."):
                found.add((node.module or "").split(".")[2])
            elif isinstance(node, ast.Import):
                found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("dispatch.cli."))
        graph[name] = found & names - {name}
    return graph


def test_the_cli_modules_import_no_circle() -> None:
    """The command modules build on the CLI's common parts, which never import them back (the group in
    ``commands`` gathers them): no module of ``dispatch.cli`` is reached again from what it imports."""
    graph = _cli_graph()
    circles: list[list[str]] = []

    def visit(name: str, path: list[str]) -> None:
        for nxt in sorted(graph[name]):
            if nxt in path:
                circles.append([*path[path.index(nxt) :], nxt])
            elif len(path) < len(graph):
                visit(nxt, [*path, nxt])

    for start in sorted(graph):
        visit(start, [start])
    assert circles == []
    assert "commands" not in set().union(*graph.values())  # only the entry point loads the group


def test_the_page_reads_through_the_cluster_only() -> None:
    """``dispatch.ui`` reads records through :class:`dispatch.Cluster` (docs/architecture.md): it imports
    no store and never reaches for ``cluster.store``."""
    offenders = []
    for path in _modules("dispatch/ui"):
        tree = ast.parse(path.read_text())
        offenders += [
            f"{path.relative_to(SRC)}:{node.lineno} uses .store"
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr == "store"
        ]
        offenders += [
            f"{path.relative_to(SRC)} imports {n}" for n in _imports(path) if n.startswith("dispatch.records")
        ]
    assert offenders == []


_GLOBAL_DRAWS = {
    "random",
    "uniform",
    "choice",
    "choices",
    "randint",
    "randrange",
    "shuffle",
    "sample",
    "getrandbits",
    "seed",
    "gauss",
    "triangular",
    "expovariate",
}


def test_no_module_draws_from_the_global_random_generator() -> None:
    """Every random draw comes from a generator handed to its code (``dispatch.chance``), so the simulation
    replays a seed exactly: a call such as ``random.uniform(...)`` on the module draws from the process's
    global generator, which no seed governs (the supervisor's resync jitter once did: a seed that could
    not be replayed could not be debugged)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "random":
                names = [a.name for a in node.names if a.name in _GLOBAL_DRAWS]
                if names:
                    found.append(f"{path.relative_to(SRC)}:{node.lineno}: from random import {names}")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "random"
                and node.func.attr in _GLOBAL_DRAWS
            ):
                found.append(f"{path.relative_to(SRC)}:{node.lineno}: random.{node.func.attr}(...)")
    assert found == [], found


CLASS_LINES = 400
"""A class past this many lines does two things (STYLE.md, docs/architecture.md): split it along what
it does. Counted from ``class`` to its last line, docstrings and comments included."""


def _long_classes(root: Path) -> list[str]:
    """Every class under ``root`` (nested ones included) longer than :data:`CLASS_LINES`."""
    long = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                lines = node.end_lineno - node.lineno + 1
                if lines > CLASS_LINES:
                    long.append(f"{path.relative_to(root)}:{node.lineno} {node.name}: {lines} lines")
    return long


def test_no_class_in_the_host_is_over_400_lines() -> None:
    """Every class of ``dispatch``; none is excepted."""
    assert _long_classes(SRC / "dispatch") == []


def test_the_class_length_check_sees_a_long_class(tmp_path: Path) -> None:
    def klass(name: str, lines: int) -> str:
        return f"class {name}:\n" + "".join(f"    x{i} = {i}\n" for i in range(lines - 1))

    (tmp_path / "a.py").write_text(klass("Fits", CLASS_LINES) + "\n\n" + klass("Over", CLASS_LINES + 1))
    (tmp_path / "b.py").write_text(
        "def f() -> None:\n" + "    " + klass("Nested", CLASS_LINES + 2).replace("\n", "\n    ")
    )
    assert _long_classes(tmp_path) == [
        f"a.py:{CLASS_LINES + 3} Over: {CLASS_LINES + 1} lines",
        f"b.py:2 Nested: {CLASS_LINES + 2} lines",
    ]


def _calls_of(path: Path, name: str) -> int:
    """How many calls of ``name`` (a bare name, or an attribute ``x.name``) ``path`` makes."""
    tree = ast.parse(path.read_text())
    return sum(
        1
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == name)
            or (isinstance(node.func, ast.Attribute) and node.func.attr == name)
        )
    )


def test_only_the_feed_makes_a_watch_change() -> None:
    """SPEC §5: the host owns the feed. An adapter offers readings (``Feed.offer``); only ``dispatch.feed``
    makes a ``Change`` — an adapter that made its own kept its own memory of what it emitted (the Slurm
    adapter's poller did, and decided from it which jobs were lost)."""
    makers = sorted(
        str(path.relative_to(SRC))
        for package in ("dispatch", "dispatch_kubeflow", "dispatch_slurm")
        for path in _modules(package)
        if _calls_of(path, "Change")
    )
    assert makers == ["dispatch/feed.py"]
    assert _calls_of(SRC / "dispatch" / "feed.py", "Change") >= 1  # the check sees a call where there is one
