"""`qlm simulate` and `qlm capacity` end to end through the real entry point: files written,
summary.json checked key by key, report PNGs, determinism, sweeps, errors (exit 2)."""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest

from qlm.cli import main

SIMS = Path(__file__).resolve().parents[2] / "sims"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# A small scenario on the packaged profiles: interactive arrivals over a batch backlog (WA's
# shape) on one A10 and one A100.
TINY = """\
name: tiny-wa
description: WA's shape, tiny
seed: 4
fleet:
  instances:
    - {gpu_type: A10, count: 1, model: mistral-7b}
    - {gpu_type: A100, count: 1, model: mistral-7b}
workload:
  - name: chat
    arrivals: {process: poisson, rate_per_s: 4}
    count: 120
    models: {mistral-7b: 1}
    classes: {interactive: 1}
    lengths: {source: trace, path: data/azure_llm_2023_conv.csv}
  - name: backlog
    arrivals: {process: backlog}
    count: 200
    models: {mistral-7b: 1}
    classes: {batch-2: 1}
    lengths: {source: trace, path: data/azure_llm_2023_conv.csv}
"""

SUMMARY_KEYS = [
    "requests",
    "slo_attainment",
    "throughput_rps",
    "goodput_rps",
    "ttft_p50_s",
    "ttft_p99_s",
    "tbt_p50_ms",
    "tbt_p99_ms",
    "swaps",
    "evictions",
    "miss_causes",
]


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    (tmp_path / "data").mkdir()
    source = SIMS / "data" / "azure_llm_2023_conv.csv"
    (tmp_path / "data" / "azure_llm_2023_conv.csv").write_bytes(source.read_bytes())
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return path


def simulate(path: Path, out: Path, *extra: str) -> int:
    return main(["simulate", str(path), "--out", str(out), "--no-progress", *extra])


def check_summary(doc: dict[str, object], policies: list[str], requests: int) -> None:
    assert list(doc) == ["scenario", "seed", "policies", "bound"]
    assert doc["scenario"] == "tiny-wa"
    assert doc["seed"] == 4
    entries = doc["policies"]
    assert isinstance(entries, dict)
    assert list(entries) == policies
    for name, entry in entries.items():
        predicts = name.startswith("qlm")  # only qlm predicts waits
        assert list(entry) == SUMMARY_KEYS + (["ttft_prediction"] if predicts else [])
        if predicts:
            accuracy = entry["ttft_prediction"]
            assert list(accuracy) == ["overall", "by_class", "by_prompt_band"]
            overall = accuracy["overall"]
            assert overall["requests"] + overall["predicted_miss"] == requests
            assert overall["median_abs_error_s"] >= 0.0
        assert entry["requests"] == requests
        assert isinstance(entry["requests"], int)
        att = entry["slo_attainment"]
        assert list(att) == ["overall", "interactive", "batch-2"]
        assert all(isinstance(v, float) and 0.0 <= v <= 1.0 for v in att.values())
        for key in ("throughput_rps", "goodput_rps", "ttft_p50_s", "ttft_p99_s"):
            assert isinstance(entry[key], float)
            assert entry[key] >= 0.0
        assert entry["goodput_rps"] <= entry["throughput_rps"] + 1e-12
        assert entry["ttft_p50_s"] <= entry["ttft_p99_s"]
        assert isinstance(entry["swaps"], int)
        assert isinstance(entry["evictions"], int)
        causes = entry["miss_causes"]
        assert list(causes)[:3] == ["failed", "unfinished", "evicted"]
        missed = round(requests * (1.0 - att["overall"]))
        assert sum(causes.values()) == missed
        for name, value in entry["slo_attainment"].items():
            assert value <= doc["bound"][name] + 1e-12  # type: ignore[index]


@pytest.mark.slow
def test_simulate_writes_csv_summary_and_report(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    policies = ["fcfs", "edf", "qlm"]
    assert simulate(tiny, out, *(f"--policy={p}" for p in policies)) == 0
    doc = json.loads((out / "summary.json").read_text())
    check_summary(doc, policies, 320)
    with (out / "requests.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 * 320
    assert {r["policy"] for r in rows} == set(policies)
    fcfs_rows = [r for r in rows if r["policy"] == "fcfs"]
    met = sum(r["met_slo"] == "1" for r in fcfs_rows) / 320
    assert met == pytest.approx(doc["policies"]["fcfs"]["slo_attainment"]["overall"])
    assert all((r["met_slo"] == "1") == (r["miss_cause"] == "") for r in rows)
    by_cause = Counter(r["miss_cause"] for r in fcfs_rows if r["miss_cause"])
    assert by_cause == {k: v for k, v in doc["policies"]["fcfs"]["miss_causes"].items() if v}
    assert {r["instance"] for r in fcfs_rows} <= {"a10-mistral-7b-0", "a100-mistral-7b-0", ""}
    report = (out / "report.md").read_text()
    assert "## Why requests missed" in report
    assert "\n| bound | " in report
    assert "## Prefix reuse" not in report  # no stream carries prefixes
    timings = json.loads((out / "timings.json").read_text())
    assert list(timings["policies"]) == policies
    assert all(t["sim_wall_s"] > 0 for t in timings["policies"].values())
    for png in ("attainment.png", "ttft_cdf.png", "queue_length.png", "swaps_per_instance.png"):
        assert (out / png).read_bytes()[:8] == PNG_MAGIC
        assert f"]({png})" in report
    printed = capsys.readouterr().out
    assert "policy" in printed
    assert "\nbound " in printed
    assert all(p in printed for p in policies)


@pytest.mark.slow
def test_same_seed_same_outputs_other_seed_differs(tiny: Path, tmp_path: Path) -> None:
    runs = []
    for k, seed in enumerate(("4", "4", "5")):
        out = tmp_path / f"run{k}"
        assert simulate(tiny, out, "--policy", "fcfs", "--policy", "llmd", "--seed", seed) == 0
        summary = (out / "summary.json").read_bytes()
        runs.append(((out / "requests.csv").read_bytes(), summary))
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[2][0]


@pytest.mark.slow
def test_sweep_writes_one_run_per_rate(tiny: Path, tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    assert simulate(tiny, out, "--policy", "fcfs", "--sweep", "rate=0.5,2") == 0
    sweep = json.loads((out / "sweep.json").read_text())
    assert sweep["parameter"] == "rate_scale"
    assert [p["rate_scale"] for p in sweep["points"]] == [0.5, 2.0]
    for point in sweep["points"]:
        folder = out / point["folder"]
        assert json.loads((folder / "summary.json").read_text()) == point["summary"]
        assert (folder / "report.md").exists()
    assert (out / "sweep_attainment.png").read_bytes()[:8] == PNG_MAGIC
    assert "rate x 2" in (out / "report.md").read_text()


def test_bad_scenario_exits_2_naming_file_line_field(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny.write_text(TINY.replace("rate_per_s: 4", "rate_per_s: fast"))
    assert simulate(tiny, tmp_path / "x") == 2
    err = capsys.readouterr().err
    assert "tiny.yaml:10: workload.0.arrivals.poisson.rate_per_s" in err
    assert not (tmp_path / "x").exists()


def test_unknown_policy_exits_2_listing_known(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert simulate(tiny, tmp_path / "x", "--policy", "magic") == 2
    err = capsys.readouterr().err
    assert "magic" in err
    assert "fcfs" in err
    assert "qlm" in err


def test_bad_sweep_and_missing_quick_sibling(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert simulate(tiny, tmp_path / "x", "--sweep", "speed=2") == 2
    assert "--sweep" in capsys.readouterr().err
    assert simulate(tiny, tmp_path / "x", "--quick") == 2
    assert "tiny-quick.yaml" in capsys.readouterr().err


@pytest.mark.slow
def test_capacity_finds_a_fleet_and_writes_json(
    tiny: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "cap.json"
    code = main(
        [
            "capacity",
            str(tiny),
            "--target",
            "0.9",
            "--policy",
            "fcfs",
            "--cost",
            "A10=1,A100=3.7",
            "--max-count",
            "4",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    doc = json.loads(out.read_text())
    assert doc["policy"] == "fcfs"
    assert doc["cost_per_gpu_hour"] == {"A10": 1.0, "A100": 3.7}
    best = doc["best"]
    assert best["meets"]
    assert best["attainment"] >= 0.9
    assert not any(
        e["meets"] and e["cost_per_hour"] < best["cost_per_hour"] for e in doc["evaluated"]
    )
    printed = capsys.readouterr().out
    assert printed.count("evaluated ") == len(doc["evaluated"])
    assert "cheapest:" in printed


def test_capacity_rejects_unknown_gpu_types(tiny: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["capacity", str(tiny), "--gpu-types", "H100"]) == 2
    assert "count: 0" in capsys.readouterr().err


def test_quick_runs_the_quick_sibling(tiny: Path, tmp_path: Path) -> None:
    sibling = tiny.with_name("tiny-quick.yaml")
    sibling.write_text(TINY.replace("name: tiny-wa", "name: tiny-wa-quick").replace("120", "30"))
    out = tmp_path / "quick"
    assert simulate(tiny, out, "--quick", "--policy", "fcfs") == 0
    doc = json.loads((out / "summary.json").read_text())
    assert doc["scenario"] == "tiny-wa-quick"
    assert doc["policies"]["fcfs"]["requests"] == 230
