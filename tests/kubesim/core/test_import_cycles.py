"""kubesim's modules import one another without circles (issue 24 named kubelet ↔ actions, kueue ↔
kueue_scheduler and server ↔ sim): every import counts, ``TYPE_CHECKING`` and function-level ones too.
``from package import module`` is an edge to that module, not to the package's ``__init__``."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[3] / "src"


def import_graph() -> dict[str, set[str]]:
    modules: dict[str, Path] = {}
    for path in (SRC / "kubesim").rglob("*.py"):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
                targets = subs if len(subs) == len(node.names) else [node.module, *subs]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_the_imports_it_must() -> None:
    graph = import_graph()
    assert "kubesim.controllers.kueue_scheduler" in graph["kubesim.controllers.kueue"]
    assert "kubesim.server" in graph["kubesim.sim"]
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_kubesim_has_no_import_cycles() -> None:
    assert cycles(import_graph()) == []
