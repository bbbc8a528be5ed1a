"""Every benchmark module imports: a benchmark is run by hand, rarely, so a name it imports
from the package can vanish unnoticed (benchmarks/vllm_baseline.py imported
`completion_body` for days after the vLLM protocol renamed it). Importing runs no benchmark:
each module does its work under `main()`. A third-party library this machine lacks (Triton
for the GPU benchmark) skips its module; anything missing from qlm or benchmarks fails."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent.parent / "benchmarks"
OURS = ("qlm", "benchmarks")


def modules() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue  # runs the benchmark when imported
        found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


@pytest.mark.parametrize("name", modules())
def test_the_benchmark_module_imports(name: str) -> None:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] in OURS:
            raise
        pytest.skip(f"{name} needs {exc.name}, not installed here")
