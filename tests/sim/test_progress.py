"""`qlm simulate` shows its progress bars only when stderr is a terminal: never in a log or CI
output, and never with --no-progress."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from qlm.cli import main
from tests.sim.test_cli import tiny  # noqa: F401  (the fixture)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def stderr_of(
    monkeypatch: pytest.MonkeyPatch, stream: io.StringIO, scenario: Path, out: Path, *extra: str
) -> str:
    monkeypatch.setattr("sys.stderr", stream)
    assert main(["simulate", str(scenario), "--out", str(out), "--policy", "fcfs", *extra]) == 0
    return stream.getvalue()


def test_a_terminal_gets_a_bar(
    monkeypatch: pytest.MonkeyPatch,
    tiny: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    assert "req" in stderr_of(monkeypatch, Terminal(), tiny, tmp_path)


def test_a_log_gets_no_bar(
    monkeypatch: pytest.MonkeyPatch,
    tiny: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    assert stderr_of(monkeypatch, io.StringIO(), tiny, tmp_path) == ""


def test_no_progress_turns_it_off_on_a_terminal_too(
    monkeypatch: pytest.MonkeyPatch,
    tiny: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    assert stderr_of(monkeypatch, Terminal(), tiny, tmp_path, "--no-progress") == ""
