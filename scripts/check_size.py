"""Size rules (STYLE: files <= 400 lines, functions <= 60 lines): list what breaks them.

    python scripts/check_size.py [PATH ...]     (default: qlm benchmarks)

Exits 1 when anything is over. tests/test_size.py runs the same check."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
ROOT = Path(__file__).resolve().parent.parent


def python_files(paths: list[Path]) -> Iterator[Path]:
    for path in paths:
        yield from sorted(path.rglob("*.py")) if path.is_dir() else [path]


def long_functions(path: Path) -> Iterator[tuple[str, int]]:
    """(qualified name, lines) of each function over the limit, decorators excluded."""
    tree = ast.parse(path.read_text())

    def walk(node: ast.AST, prefix: str) -> Iterator[tuple[str, int]]:
        for child in ast.iter_child_nodes(node):
            name = getattr(child, "name", "")
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (child.end_lineno or child.lineno) - child.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    yield f"{prefix}{name}", lines
            yield from walk(child, f"{prefix}{name}." if name else prefix)

    yield from walk(tree, "")


def problems(paths: list[Path]) -> list[str]:
    found: list[str] = []
    for path in python_files(paths):
        rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path
        lines = len(path.read_text().splitlines())
        if lines > MAX_FILE_LINES:
            found.append(f"{rel}: {lines} lines (> {MAX_FILE_LINES})")
        for name, n in long_functions(path):
            found.append(f"{rel}: {name} is {n} lines (> {MAX_FUNCTION_LINES})")
    return found


def main(argv: list[str]) -> int:
    paths = [Path(a).resolve() for a in argv] or [ROOT / "qlm", ROOT / "benchmarks"]
    found = problems(paths)
    print("\n".join(found) or "all within limits")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
