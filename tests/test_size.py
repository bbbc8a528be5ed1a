"""STYLE's size rules hold (scripts/check_size.py): files in qlm/ and benchmarks/ at most 400
lines, functions at most 60."""

from __future__ import annotations

from scripts.check_size import ROOT, problems


def test_files_and_functions_within_limits() -> None:
    assert problems([ROOT / "qlm", ROOT / "benchmarks"]) == []
