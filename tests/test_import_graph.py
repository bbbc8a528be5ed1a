"""No import cycles: between modules of qlm, and between its top-level parts (the packages
under qlm/ and its top-level modules, e.g. qlm.types, qlm.config). Imports under
`if TYPE_CHECKING:` count too: a cycle there still ties the parts together."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "qlm"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The qlm modules a file imports (`from a.b import c` counts a.b.c when that is a
    module, else a.b)."""
    found: set[str] = set()
    package = module_name(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in modules}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + (path.name == "__init__.py")]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in modules:
                    found.add(full)
                elif base in modules:
                    found.add(base)
    found.discard(module_name(path))
    return found


def graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(f) for f in files}
    return {module_name(f): imports_of(f, modules) for f in files}


def top_level(module: str) -> str:
    return ".".join(module.split(".")[:2])


def cycles(edges: Mapping[str, set[str]]) -> Iterator[list[str]]:
    """One cycle per strongly connected component with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> Iterator[list[str]]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                yield from visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                yield sorted(component)

    for node in sorted(edges):
        if node not in index:
            yield from visit(node)


def test_the_graph_sees_real_imports() -> None:
    edges = graph()
    assert "qlm.perf.profile" in edges["qlm.types"]
    assert "qlm.control.controller" in edges["qlm.control.driver"]


def test_no_cycle_between_modules() -> None:
    assert list(cycles(graph())) == []


def test_no_cycle_between_top_level_parts() -> None:
    parts: dict[str, set[str]] = {}
    for module, targets in graph().items():
        if module == "qlm":
            continue
        edges = parts.setdefault(top_level(module), set())
        edges |= {top_level(t) for t in targets if t != "qlm"} - {top_level(module)}
    assert list(cycles(parts)) == []


@pytest.mark.parametrize("edges", [{"a": {"b"}, "b": {"a"}}, {"a": {"b"}, "b": {"c"}, "c": {"a"}}])
def test_the_cycle_finder_finds_cycles(edges: dict[str, set[str]]) -> None:
    assert list(cycles(edges)) == [sorted(edges)]


def test_the_configuration_package_is_a_leaf() -> None:
    """qlm/config/ holds every settings class and imports only the domain values and the
    performance model: components import their settings from it, never the other way round
    (a setting that needs a component's code builds itself there, e.g. ReconcileConfig.of)."""
    reached = {
        top_level(target)
        for module, targets in graph().items()
        if top_level(module) == "qlm.config"
        for target in targets
    }
    assert reached - {"qlm.config"} <= {"qlm.types", "qlm.perf"}
    assert "qlm.config.agent_settings" in graph()["qlm.agents.queued"]  # the direction
