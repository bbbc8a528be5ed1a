"""benchmarks/report.py: the marked docs blocks every benchmark writes into one shared file,
the run header, and the results files."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from benchmarks import report

SOLVER = "<!-- solver:begin -->\nsolver figures\n<!-- solver:end -->"
SIM = "<!-- simulator:begin -->\nold simulator figures\n<!-- simulator:end -->"


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    path = tmp_path / "docs" / "benchmarks.md"
    path.parent.mkdir()
    path.write_text(f"# Benchmarks\n\nIntro.\n\n{SOLVER}\n\n{SIM}\n\nTail text.\n")
    return path


def test_block_is_replaced_in_place_and_the_rest_of_the_file_stays(docs: Path) -> None:
    report.write_docs_block("simulator", "new\nfigures", docs)
    assert docs.read_text() == (
        "# Benchmarks\n\nIntro.\n\n"
        f"{SOLVER}\n\n"
        "<!-- simulator:begin -->\nnew\nfigures\n<!-- simulator:end -->\n\n"
        "Tail text.\n"
    )


def test_block_is_appended_when_absent(docs: Path) -> None:
    before = docs.read_text()
    report.write_docs_block("control-plane", "cp figures", docs)
    assert docs.read_text() == (
        before + "\n<!-- control-plane:begin -->\ncp figures\n<!-- control-plane:end -->\n"
    )


def test_a_block_named_like_the_prefix_of_another_is_a_different_block(docs: Path) -> None:
    report.write_docs_block("sim", "x", docs)
    text = docs.read_text()
    assert SIM in text
    assert text.endswith("<!-- sim:begin -->\nx\n<!-- sim:end -->\n")


def test_writing_a_block_twice_is_idempotent(docs: Path) -> None:
    report.write_docs_block("solver", "first", docs)
    report.write_docs_block("solver", "second", docs)
    once = docs.read_text()
    report.write_docs_block("solver", "second", docs)
    assert docs.read_text() == once
    assert once.count("<!-- solver:begin -->") == 1
    assert "first" not in once
    assert SIM in once


def test_missing_docs_file_is_created_with_a_title(tmp_path: Path) -> None:
    path = tmp_path / "new" / "benchmarks.md"
    report.write_docs_block("solver", "figures", path)
    assert path.read_text() == (
        "# Benchmarks\n\n<!-- solver:begin -->\nfigures\n<!-- solver:end -->\n"
    )


def test_header_lines_match_the_format_of_the_docs() -> None:
    header = {
        "command": ".venv/bin/python -m benchmarks.solver --quick",
        "date": "2025-01-02T03:04:05+00:00",
        "machine": "os.cpu_count() = 2; noisy",
        "platform": "Linux-6, Python 3.11.9",
        "code": "abc1234",
        "loadavg_before": [1.5, 1.25, 1.0],
        "loadavg_after": [2.0, 1.5, 1.125],
    }
    assert report.header_lines(header) == [
        "Command: `.venv/bin/python -m benchmarks.solver --quick`  ",
        "Date: 2025-01-02T03:04:05+00:00  ",
        "Machine: os.cpu_count() = 2; noisy (Linux-6, Python 3.11.9)  ",
        "Load average (1, 5, 15 min) before / after: 1.50, 1.25, 1.00 / 2.00, 1.50, 1.12  ",
        "Code: abc1234",
    ]
    old = {k: v for k, v in header.items() if not k.startswith("loadavg")}
    assert [line.split(":")[0] for line in report.header_lines(old)] == [
        "Command",
        "Date",
        "Machine",
        "Code",
    ]
    unknown = {**header, "loadavg_before": None, "loadavg_after": None}
    assert "before / after: - / -  " in report.header_lines(unknown)[3]


def test_run_header_records_the_command_as_it_can_be_retyped() -> None:
    header = report.run_header("sim_quality.py", ["--scenarios", "wa,wb", "a b"], "noisy")
    assert header["command"] == ".venv/bin/python -m benchmarks.sim_quality --scenarios wa,wb 'a b'"
    assert header["machine"].endswith("; noisy")
    assert "loadavg_after" not in header
    report.finish_header(header)
    assert set(header) >= {"date", "platform", "code", "loadavg_before", "loadavg_after"}
    assert report.command_line("solver.py", []) == ".venv/bin/python -m benchmarks.solver"


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_code_version_flags_uncommitted_code_but_not_other_files(tmp_path: Path) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "qlm").mkdir()
    (tmp_path / "qlm" / "core.py").write_text("x = 1\n")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    clean = report.code_version(tmp_path)
    assert len(clean) >= 7
    assert " " not in clean
    (tmp_path / "NOTES.md").write_text("docs are not measured\n")
    assert report.code_version(tmp_path) == clean
    (tmp_path / "qlm" / "core.py").write_text("x = 2\n")
    assert report.code_version(tmp_path) == f"{clean} + uncommitted changes in qlm/"
    assert report.code_version(tmp_path / "qlm" / "nowhere") == "unknown (no git)"


def test_results_are_strict_json(tmp_path: Path) -> None:
    path = tmp_path / "results" / "x.json"
    report.write_results(path, {"p99": math.nan, "rate": math.inf, "ok": 1.5, "at": (1, 2)})
    text = path.read_text()
    assert text.endswith("}\n")
    assert json.loads(text) == {"p99": None, "rate": None, "ok": 1.5, "at": [1, 2]}
    assert report.json_safe({1: Path("a/b")}) == {"1": "a/b"}
