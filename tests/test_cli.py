"""`qlm plan`: the main job runs on the example snapshot; bad files name file, line, field."""

from __future__ import annotations

from pathlib import Path

import pytest

from qlm.cli import main

EXAMPLE = Path(__file__).parent.parent / "examples" / "plan.yaml"


@pytest.mark.solver
def test_plan_prints_attainment_per_class_for_each_policy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc = main(["plan", str(EXAMPLE), "--policy", "fcfs", "--policy", "milp", "--time-limit", "0.5"])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert "interactive" in lines[1]
    assert "batch-1" in lines[1]
    assert "batch-2" in lines[1]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"fcfs", "milp"}
    # Static placement (fcfs) never swaps; every row reports a percentage per class.
    assert rows["fcfs"][3] == "0"
    assert all(cell.endswith("%") for cell in rows["milp"][4:])


def test_bad_snapshot_names_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    text = EXAMPLE.read_text().replace("count: 300,", "count: -3,")
    bad.write_text(text)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "count: -3" in s)
    rc = main(["plan", str(bad)])
    err = capsys.readouterr().err
    assert rc == 2
    assert f"{bad}:{line}: requests.0.count" in err


def test_unknown_policy_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["plan", str(EXAMPLE), "--policy", "nope"])
    assert rc == 2
    assert "unknown planner policy 'nope'; known: edf, fcfs, milp" in capsys.readouterr().err
