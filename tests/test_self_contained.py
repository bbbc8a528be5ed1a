"""A clone runs anywhere: no file the package, the tests, the benchmarks or the scripts read
names a path outside the repository (the workspace's sibling folders, absolute paths under
/work). Public data the project needs is copied into sims/data, with its licence in NOTICE."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("qlm", "tests", "benchmarks", "scripts", "examples", "sims", "deploy", ".ci")
SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".toml", ".cfg"}  # code and configuration, not results
# The workspace's sibling folder (../shared, or a path joined with "shared"), or /work/...
OUTSIDE = re.compile(r"\.\./shared\b|/work/|/\s*[\"']shared[\"']")
THIS = Path(__file__).resolve()


def checked_files() -> list[Path]:
    files = [ROOT / "Makefile", ROOT / ".ci" / "run"]
    for folder in FOLDERS:
        for path in (ROOT / folder).rglob("*"):
            code = path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts
            if code and path.resolve() != THIS:
                files.append(path)
    return files


def test_no_file_names_a_path_outside_the_repository() -> None:
    offenders = []
    for path in checked_files():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_the_pattern_catches_what_it_is_for() -> None:
    assert OUTSIDE.search('LENGTHS = ROOT.parent / "shared" / "x.csv"')
    assert OUTSIDE.search('DATA = Path("/work/shared/data")')
    assert OUTSIDE.search("see ../shared/data/README.md")
    assert OUTSIDE.search('Path(__file__).parent.parent.parent / "shared"')
    assert not OUTSIDE.search("sims/data/azure_llm_2023_conv.csv")
    assert not OUTSIDE.search("../data/azure_llm_2023_conv.csv")  # from sims/x.yaml: inside
    assert not OUTSIDE.search("a prefix shared / reused")


def test_every_data_file_has_its_notice() -> None:
    notice = (ROOT / "sims" / "data" / "NOTICE").read_text(encoding="utf-8")
    data = [p.name for p in (ROOT / "sims" / "data").iterdir() if p.name != "NOTICE"]
    assert data
    assert all(name in notice for name in data), data
