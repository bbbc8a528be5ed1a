"""The outputs of `qlm simulate` from hand-made results: summary.json in the issue's schema,
requests.csv rows, the printed table, the report and its PNG plots, the sweep document."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from qlm.sim.report import (
    CSV_COLUMNS,
    PLOTS,
    RunInfo,
    SweepPoint,
    summary_document,
    summary_table,
    sweep_document,
    write_json,
    write_report,
    write_requests_csv,
    write_sweep_report,
)
from qlm.sim.result import OutcomeState, QueueSample, RequestOutcome, SimResult
from qlm.sim.scenario import Scenario

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def outcome(
    rid: str,
    cls: str,
    arrival: float,
    first: float | None,
    finish: float | None,
    deadline: float,
    instance: str | None = "i0",
    state: OutcomeState = OutcomeState.COMPLETED,
) -> RequestOutcome:
    return RequestOutcome(
        request_id=rid,
        slo_class=cls,
        model="m7b",
        instance_id=instance,
        arrival_s=arrival,
        dispatch_s=None if first is None else arrival + 0.1,
        first_token_s=first,
        finish_s=finish,
        ttft_deadline_s=deadline,
        completion_deadline_s=None,
        evictions=0,
        state=state,
    )


def result(policy: str, late: bool) -> SimResult:
    outcomes = (
        outcome("a", "interactive", 0.0, 1.0, 5.0, 20.0),
        outcome("b", "interactive", 1.0, 30.0 if late else 2.0, 40.0, 21.0, "i1"),
        outcome("c", "batch-2", 0.0, 50.0, 60.0, 3600.0),
        outcome("d", "batch-2", 2.0, None, None, 3602.0, None, OutcomeState.UNFINISHED),
    )
    return SimResult(
        policy=policy,
        seed=5,
        slo_classes=("interactive", "batch-1", "batch-2"),
        outcomes=outcomes,
        interrupted=(),
        loads=(),
        swaps={"i0": 1 if late else 0, "i1": 2},
        evictions=3,
        queue_samples=tuple(QueueSample(float(t), (t % 3, 0, 2)) for t in range(0, 60, 5)),
        events_processed=100,
        start_s=0.0,
        end_s=100.0,
        sim_wall_s=0.25,
    )


@pytest.fixture
def results() -> list[SimResult]:
    return [result("fcfs", late=True), result("qlm", late=False)]


@pytest.fixture
def scenario() -> Scenario:
    return Scenario.model_validate(
        {
            "name": "fake",
            "description": "made by hand",
            "fleet": {
                "instances": [{"gpu_type": "A100", "count": 2, "model": "m7b"}],
                "profiles": [
                    {
                        "model": "m7b",
                        "gpu_type": "A100",
                        "weight_bytes": 14 << 30,
                        "kv_bytes_per_token": 128 * 1024,
                        "decode_table": {"batch_sizes": [1, 64], "step_s": [0.02, 0.04]},
                        "prefill_tokens_per_s": 10000,
                        "output_tokens_mean": 200,
                        "output_tokens_std": 100,
                        "load_s": 10,
                    }
                ],
            },
            "workload": [
                {
                    "name": "w",
                    "arrivals": {"process": "backlog"},
                    "count": 4,
                    "models": {"m7b": 1},
                    "classes": {"interactive": 1},
                    "lengths": {"source": "fixed", "prompt_tokens": 10, "output_tokens": 5},
                }
            ],
        }
    )


def test_summary_document_has_the_issue_schema(results: list[SimResult]) -> None:
    doc = summary_document("fake", 5, results)
    assert list(doc) == ["scenario", "seed", "policies"]
    assert doc["scenario"] == "fake"
    assert doc["seed"] == 5
    assert list(doc["policies"]) == ["fcfs", "qlm"]
    fcfs = doc["policies"]["fcfs"]
    assert list(fcfs) == [
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
    assert fcfs["requests"] == 4
    assert fcfs["slo_attainment"] == {"overall": 0.5, "interactive": 0.5, "batch-2": 0.5}
    assert doc["policies"]["qlm"]["slo_attainment"]["overall"] == 0.75
    assert fcfs["throughput_rps"] == pytest.approx(3 / 100)
    assert fcfs["goodput_rps"] == pytest.approx(2 / 100)
    assert fcfs["swaps"] == 3
    assert fcfs["evictions"] == 3
    assert fcfs["ttft_p50_s"] == pytest.approx(29.0)  # TTFTs 1, 29, 50
    # b: first token 9 s late, all of it between dispatch and first token; d: its deadline
    # (3602 s) is after the run's end (100 s).
    assert fcfs["miss_causes"] == {
        **dict.fromkeys(fcfs["miss_causes"], 0),
        "in_engine": 1,
        "unfinished": 1,
    }
    assert sum(doc["policies"]["qlm"]["miss_causes"].values()) == 1


def test_nan_becomes_null_in_json(tmp_path: Path) -> None:
    empty = SimResult(
        policy="x",
        seed=0,
        slo_classes=("interactive",),
        outcomes=(outcome("a", "interactive", 0, None, None, 20, None, OutcomeState.UNFINISHED),),
        interrupted=(),
        loads=(),
        swaps={},
        evictions=0,
        queue_samples=(),
        events_processed=0,
        start_s=0.0,
        end_s=0.0,
        sim_wall_s=0.0,
    )
    doc = summary_document("s", 0, [empty])
    assert "sim_wall_s" not in json.dumps(doc)  # the wall clock goes to timings.json
    assert doc["policies"]["x"]["ttft_p50_s"] is None
    write_json(tmp_path / "s.json", doc)
    assert json.loads((tmp_path / "s.json").read_text())["policies"]["x"]["ttft_p99_s"] is None


def test_requests_csv_has_one_row_per_request_and_policy(
    tmp_path: Path, results: list[SimResult]
) -> None:
    path = tmp_path / "requests.csv"
    assert write_requests_csv(path, results) == 8
    with path.open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == CSV_COLUMNS
    assert [r["policy"] for r in rows] == ["fcfs"] * 4 + ["qlm"] * 4
    late = rows[1]
    assert late["id"] == "b"
    assert late["instance"] == "i1"
    assert float(late["ttft_s"]) == pytest.approx(29.0)
    assert late["met_slo"] == "0"
    assert late["miss_cause"] == "in_engine"
    assert rows[5]["met_slo"] == "1"
    assert rows[5]["miss_cause"] == ""
    unfinished = rows[3]
    assert unfinished["first_token_s"] == ""
    assert unfinished["instance"] == ""
    assert unfinished["state"] == "unfinished"
    assert unfinished["miss_cause"] == "unfinished"


def test_summary_table_lists_every_policy_and_class(results: list[SimResult]) -> None:
    table = summary_table(results).splitlines()
    assert table[0].split()[:4] == ["policy", "overall", "interactive", "batch-2"]
    assert table[1].split()[:3] == ["fcfs", "50.0%", "50.0%"]
    assert table[2].split()[:3] == ["qlm", "75.0%", "100.0%"]


def test_report_writes_markdown_and_four_pngs(
    tmp_path: Path, results: list[SimResult], scenario: Scenario
) -> None:
    path = write_report(tmp_path, RunInfo(scenario, 5, "qlm simulate fake.yaml"), results)
    text = path.read_text()
    assert "# Simulation report: fake" in text
    assert "qlm simulate fake.yaml" in text
    assert "| fcfs | 50.0% | 50.0% | 50.0% |" in text
    assert "## Why requests missed" in text
    causes = "| policy | missed | failed | unfinished | evicted | no_instance | model_load |"
    assert causes in text
    assert "| fcfs | 2 | 0 | 1 (50%) | 0 | 0 | 0 | 0 | 1 (50%) | 0 |" in text
    assert "| qlm | 1 | 0 | 1 (100%) | 0 | 0 | 0 | 0 | 0 | 0 |" in text
    for name in PLOTS.values():
        assert f"]({name})" in text
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC


def test_swap_plot_switches_to_a_heat_map_for_large_fleets(
    tmp_path: Path, scenario: Scenario
) -> None:
    big = result("qlm", late=False)
    big = SimResult(**{**big.__dict__, "swaps": {f"i{k:02d}": k % 3 for k in range(40)}})
    write_report(tmp_path, RunInfo(scenario, 5), [big])
    assert (tmp_path / PLOTS["swaps"]).stat().st_size > 1000


def test_sweep_document_and_report(
    tmp_path: Path, results: list[SimResult], scenario: Scenario
) -> None:
    points = [
        SweepPoint(0.5, "rate-0.5", tuple(results)),
        SweepPoint(2.0, "rate-2", tuple(results)),
    ]
    doc = sweep_document("fake", 5, points)
    assert doc["parameter"] == "rate_scale"
    assert [p["rate_scale"] for p in doc["points"]] == [0.5, 2.0]
    assert doc["points"][1]["summary"]["policies"]["qlm"]["slo_attainment"]["overall"] == 0.75
    path = write_sweep_report(tmp_path, RunInfo(scenario, 5), points)
    assert "rate x 2" in path.read_text()
    for name in ("sweep_attainment.png", "sweep_throughput.png"):
        assert (tmp_path / name).read_bytes()[:8] == PNG_MAGIC
    assert not math.isnan(doc["points"][0]["summary"]["policies"]["fcfs"]["ttft_p99_s"])
