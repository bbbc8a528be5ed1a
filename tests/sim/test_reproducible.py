"""summary.json and requests.csv hold only what the simulation decided: two runs of the same
scenario and seed write them byte for byte alike for every policy, one on an idle machine and
one beside CPU-heavy processes (the MILP policy runs CP-SAT on a deterministic work budget, so a
slower machine changes no plan). Wall-clock figures go to timings.json."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from qlm.cli import main

SIMS = Path(__file__).resolve().parents[2] / "sims"
POLICIES = ("fcfs", "edf", "shepherd", "llmd", "qlm")
HOG = "while True: pass"


@pytest.fixture
def small_wa(tmp_path: Path) -> Path:
    """wa-quick with 500 interactive requests over a backlog of 700: big enough that qlm's
    CP-SAT stops on its work budget at least once (plans_timeout), small enough for ~2 s."""
    (tmp_path / "data").mkdir()
    trace = "azure_llm_2023_conv.csv"
    (tmp_path / "data" / trace).write_bytes((SIMS / "data" / trace).read_bytes())
    text = (SIMS / "wa-quick.yaml").read_text()
    assert text.count("count: 1500") == 1
    assert text.count("count: 2000") == 1
    path = tmp_path / "small-wa.yaml"
    path.write_text(text.replace("count: 1500", "count: 500").replace("count: 2000", "count: 700"))
    return path


@contextmanager
def cpu_hogs(count: int) -> Iterator[None]:
    """`count` busy Python processes for the duration of the block."""
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(count)]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait()


def run(scenario: Path, out: Path) -> tuple[bytes, bytes]:
    argv = ["simulate", str(scenario), "--out", str(out), "--no-progress"]
    assert main([*argv, *(f"--policy={p}" for p in POLICIES)]) == 0
    return (out / "summary.json").read_bytes(), (out / "requests.csv").read_bytes()


@pytest.mark.slow
def test_outputs_are_byte_identical_on_an_idle_and_a_busy_machine(
    small_wa: Path, tmp_path: Path
) -> None:
    idle = run(small_wa, tmp_path / "idle")
    with cpu_hogs(2):
        busy = run(small_wa, tmp_path / "busy")
    assert idle[0] == busy[0]
    assert idle[1] == busy[1]
    assert b"sim_wall_s" not in idle[0]
    assert (tmp_path / "busy" / "timings.json").read_text().count("sim_wall_s") == len(POLICIES)
