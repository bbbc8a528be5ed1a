"""Layer rules: the policy core imports no I/O library (DESIGN.md: functional core, I/O at the
edges), and only qlm/clock.py reads time."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).parent.parent / "qlm"
IO_LIBRARIES = {"redis", "fastapi", "httpx", "requests", "aiohttp", "socket", "vllm", "kubernetes"}
CORE = ["types.py", "config.py", "registry.py", "engine", "queue", "estimator", "solver", "agents"]


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def core_files() -> list[Path]:
    files: list[Path] = []
    for part in CORE:
        target = PACKAGE / part
        files += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    return files


@pytest.mark.parametrize("path", core_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_core_imports_no_io_library(path: Path) -> None:
    assert not imported_roots(path) & IO_LIBRARIES


@pytest.mark.parametrize("path", core_files(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_only_the_clock_reads_time(path: Path) -> None:
    assert "time" not in imported_roots(path)
