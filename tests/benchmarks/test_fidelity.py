"""benchmarks/fidelity/: its comparison and estimator checks on hand-made runs, the scenario
files it writes, and (marked vllm) the --quick run end to end against real vLLM."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks.fidelity import main as fidelity_main
from benchmarks.fidelity.comparison import compare, disagreements
from benchmarks.fidelity.estimator import check_estimator
from benchmarks.fidelity.outcomes import LiveRun, Outcome, Prediction
from benchmarks.fidelity.profiles import (
    capacity_rps,
    refit_profile,
    slowdown,
    with_profiles,
)
from benchmarks.fidelity.scenarios import write_scenario
from benchmarks.fidelity.settings import (
    DOCS,
    JUST_BEFORE,
    MAX_OUTPUT_TOKENS,
    MAX_PROMPT_TOKENS,
    UP_FRONT,
    Paths,
    RunSpec,
)
from benchmarks.fidelity.tables import disagreement_table, error_table, misses
from benchmarks.report import ROOT
from qlm.config.profile_files import ProfileFile, save_profile
from qlm.engine.profiling.calibration import StepTimeFit
from qlm.engine.profiling.measured import ProfileFit
from qlm.perf.profile import Profile
from qlm.perf.step import StepTime
from qlm.sim.result import OutcomeState, RequestOutcome, SimResult
from qlm.types import Fleet
from tests.vllm_fixtures import vllm_python  # noqa: F401

STEP = StepTime(base_s=2e-3, per_prefill_token_s=1e-4, per_decode_seq_s=1e-4, per_context_token_s=0)


def outcome(rid: str, arrival: float, dispatch: float, first: float, finish: float) -> Outcome:
    return Outcome(rid, "interactive", "tiny-a", arrival, dispatch, first, finish, True, 0, "i")


def sim_result(outcomes: list[Outcome], scale: float) -> SimResult:
    """The same requests, every duration after arrival `scale` times the live one."""
    rows = tuple(
        RequestOutcome(
            request_id=o.id,
            slo_class=o.slo_class,
            model=o.model,
            instance_id="i",
            arrival_s=o.arrival_s,
            dispatch_s=o.arrival_s + scale * ((o.dispatch_s or 0.0) - o.arrival_s),
            first_token_s=o.arrival_s + scale * ((o.first_token_s or 0.0) - o.arrival_s),
            finish_s=o.arrival_s + scale * ((o.finish_s or 0.0) - o.arrival_s),
            ttft_deadline_s=o.arrival_s + 1.0,
            completion_deadline_s=None,
            evictions=0,
            state=OutcomeState.COMPLETED,
        )
        for o in outcomes
    )
    return SimResult("qlm", 0, ("interactive",), rows, (), (), {}, 0, (), 0, 0.0, 10.0, 0.1)


def live_run(outcomes: list[Outcome], predictions: dict[str, Prediction]) -> LiveRun:
    return LiveRun(outcomes, [], predictions, [0.01], swaps=1, evictions=2, replans=3)


OUTCOMES = [outcome(f"r{i}", float(i), i + 0.1, i + 0.2 * (1 + i), i + 1.0 + i) for i in range(9)]


def test_a_simulator_ten_percent_slow_shows_ten_percent_errors() -> None:
    comparison = compare("run", live_run(OUTCOMES, {}), sim_result(OUTCOMES, 1.1))
    assert comparison.requests == 9
    for metric in ("ttft", "e2e"):
        for q in ("p50", "p90", "p99"):
            assert comparison.error(metric, q) == pytest.approx(0.1)
    assert comparison.ttft_paired_median_error == pytest.approx(0.1)
    assert comparison.e2e_live["p50"] == pytest.approx(5.0)  # finish - arrival: 1 + i
    assert (comparison.swaps_live, comparison.evictions_live) == (1, 2)
    assert comparison.attainment_live["overall"] == 1.0
    assert misses([comparison]) == []
    slow = compare("slow", live_run(OUTCOMES, {}), sim_result(OUTCOMES, 1.5))
    assert misses([slow]) == [
        "slow (up-front profile): TTFT p50 error 50.0% > 15.0%",
        "slow (up-front profile): end-to-end p50 error 50.0% > 10.0%",
    ]
    table = "\n".join(error_table([comparison, slow]))
    assert "**50.0%**" in table
    assert "| 10.0% |" in table


def test_disagreements_put_each_live_only_miss_down_to_wait_or_engine() -> None:
    def o(rid: str, dispatch: float, first: float, met: bool, evictions: int = 0) -> Outcome:
        return Outcome(rid, "interactive", "tiny-a", 0.0, dispatch, first, 9.0, met, evictions, "i")

    sim = {i: o(i, 0.1, 0.5, True) for i in ("w", "e", "x", "ok")}
    sim["s"] = o("s", 0.1, 2.0, False)
    live = {
        "w": o("w", 1.6, 2.0, False),  # waited 1.5 s longer, engine 0.0 longer: wait
        "e": o("e", 0.2, 1.9, False),  # waited 0.1 s longer, engine 1.3 longer: engine
        "x": o("x", 0.1, 0.6, False, evictions=1),
        "ok": o("ok", 0.1, 0.5, True),
        "s": o("s", 0.1, 0.5, True),
    }
    d = disagreements(live, sim, list(live))
    assert (d.missed_live_only, d.missed_sim_only) == (3, 1)
    assert d.by_cause == {"wait": 1, "engine": 1, "evicted": 1}
    assert d.extra_wait_p50_s == pytest.approx(0.1)  # of 1.5, 0.1, 0.0
    assert d.extra_engine_p50_s == pytest.approx(0.1)  # of 0.0, 1.3, 0.1
    comparison = replace(
        compare("run", live_run(OUTCOMES, {}), sim_result(OUTCOMES, 1.0)), disagreements=d
    )
    assert d.by_model == {"tiny-a": 3}
    assert d.first_dispatch_s == {"tiny-a": (0.1, 0.1)}
    row = "| run | up-front | 3 | 1 / 1 / 1 / 0 | tiny-a 3 | 0.100 / 0.100 "
    row += "| tiny-a 0.100 / 0.100 | 1 |"
    assert row in disagreement_table([comparison])


def test_the_estimator_check_measures_from_the_plan_and_counts_the_bound() -> None:
    outs = [outcome("a", 0.0, 2.0, 2.5, 9.0), outcome("b", 1.0, 3.0, 3.5, 9.0)]
    evicted = Outcome("c", "batch-1", "tiny-a", 0.0, 5.0, 6.0, 9.0, True, 1, "i")
    predictions = {
        # planned at 1.0: predicted first token at 1.0 + 1.0 = 2.0 (bound 3.0)
        "a": Prediction(plan_s=1.0, ttft_mean_s=1.0, ttft_p_s=2.0),
        # planned at 1.5: predicted at 1.5 + 3.0 = 4.5 (bound 3.2 < first token 3.5)
        "b": Prediction(plan_s=1.5, ttft_mean_s=3.0, ttft_p_s=1.7, annotated_mean_s=3.25),
        "c": Prediction(plan_s=0.0, ttft_mean_s=1.0, ttft_p_s=2.0),
    }
    check = check_estimator("run", live_run([*outs, evicted], predictions))
    assert (check.predicted, check.annotated, check.requests) == (2, 1, 3)  # c was evicted
    # a: predicted wait 2.0 vs dispatch 2.0 (0), TTFT 2.0 vs 2.5 (0.5)
    # b: predicted 3.5 vs dispatch 2.0 (1.5), TTFT 3.5 vs 2.5 (1.0)
    assert check.wait_abs_error_p50_s == pytest.approx(0.75)
    assert check.ttft_abs_error_p50_s == pytest.approx(0.75)
    assert check.ttft_bound_held == 0.5
    assert check.wait_bound_held == 1.0
    assert check.annotation_max_diff_s == pytest.approx(0.25)


def tiny(model: str, load_s: float) -> Profile:
    return Profile(
        model=model,
        gpu_type="cpu",
        gpu_count=1,
        weight_bytes=300_000,
        kv_bytes_per_token=1024,
        decode_batch_sizes=(1, 8),
        decode_step_s=(STEP.decode_step_s(1, 500), STEP.decode_step_s(8, 500)),
        prefill_tokens_per_s=STEP.prefill_tokens_per_s,
        output_tokens_mean=150,
        output_tokens_std=80,
        load_s=load_s,
        max_batch_size=8,
        min_kv_tokens=1024,
        gpu_memory_utilization=0.07,
        step_time=STEP,
    )


def test_capacity_is_a_full_batch_plus_each_prefill() -> None:
    # per request: 500 prompt tokens x 0.1 ms + 150 tokens x (2 + 0.8 ms) / 8
    per_request_s = 500 * 1e-4 + 150 * (2e-3 + 8e-4) / 8
    assert capacity_rps(tiny("tiny-a", 30), 500, 150) == pytest.approx(1 / per_request_s)


def test_a_fit_twice_as_slow_halves_capacity_and_slows_the_other_models_alike() -> None:
    spec = ProfileFile.of(tiny("tiny-a", 30), "test", typical_context_tokens=500)
    doubled = StepTime(4e-3, 2e-4, 2e-4, 0.0)
    fit = ProfileFit(
        StepTimeFit(doubled, samples=9, rms_relative_error=0, max_relative_error=0), ()
    )
    assert slowdown(spec, fit, 500, 150) == pytest.approx(2.0)
    assert refit_profile(spec, fit).step_time == doubled
    slowed = tiny("tiny-b", 30).slowed(2.0)  # the other models, slowed alike
    assert slowed.step_time == doubled
    assert capacity_rps(slowed, 500, 150) == pytest.approx(
        capacity_rps(tiny("b", 30), 500, 150) / 2
    )
    # every model swapped into the fleet, the rest kept
    fleet = Fleet((), {("tiny-a", "cpu"): tiny("tiny-a", 30), ("tiny-c", "cpu"): tiny("tiny-c", 5)})
    swapped = with_profiles(fleet, [replace(slowed, model="tiny-a")])
    assert swapped.profiles[("tiny-a", "cpu")].step_time == doubled
    assert swapped.profiles[("tiny-c", "cpu")].load_s == 5


def test_each_run_writes_a_scenario_that_reads_the_fitted_profiles(tmp_path: Path) -> None:
    args = argparse.Namespace(quick=True, docs=tmp_path / "fid.md")
    paths = Paths.of(args)
    paths.folder.mkdir(parents=True)
    for model in ("tiny-a", "tiny-b"):
        save_profile(tiny(model, 20.0), paths.profile(model))
    run = RunSpec("2x-swap", 2, 0.5, 10, {"tiny-a": 3.0, "tiny-b": 1.0})
    scenario = write_scenario(paths, run, 2.0, ["tiny-a", "tiny-b"])
    assert (paths.scenarios / "2x-swap.yaml").exists()
    fleet = scenario.fleet()
    assert [i.id for i in fleet.instances] == ["cpu-0", "cpu-1"]
    assert fleet.profile("tiny-b", fleet.instances[0]) == tiny("tiny-b", 20.0)
    requests = scenario.requests()
    assert requests == scenario.requests()  # the same draws every time
    assert {r.model for r in requests} == {"tiny-a", "tiny-b"}
    assert {r.slo_class for r in requests} == {"interactive", "batch-1"}
    assert max(r.prompt_tokens for r in requests) <= MAX_PROMPT_TOKENS
    assert max(r.max_output_tokens for r in requests) <= MAX_OUTPUT_TOKENS
    assert 10 <= len(requests) <= 35  # Poisson at 2/s for 10 s


def test_quick_runs_write_nowhere_near_the_committed_report() -> None:
    paths = Paths.of(argparse.Namespace(quick=True, docs=None))
    assert paths.docs != DOCS
    assert "docs" not in paths.folder.relative_to(ROOT).parts
    full = Paths.of(argparse.Namespace(quick=False, docs=None))
    assert full.docs == DOCS
    assert full.folder == ROOT / "docs" / "fidelity"


@pytest.mark.vllm
@pytest.mark.slow
@pytest.mark.benchmark
@pytest.mark.timeout(1500)
def test_the_quick_benchmark_compares_live_vllm_with_the_simulator(
    vllm_python: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    docs = tmp_path / "fidelity.md"
    assert fidelity_main.main(["--quick", "--docs", str(docs)]) == 0
    text = docs.read_text()
    assert "## Error table" in text
    assert "## The estimator on live runs" in text
    data = json.loads((tmp_path / "fidelity.json").read_text())
    # the simulator on the up-front profile and on the one re-measured just before the run
    assert [c["profile"] for c in data["comparisons"]] == [UP_FRONT, JUST_BEFORE]
    for comparison in data["comparisons"]:
        assert comparison["requests"] > 5
        assert comparison["completed_live"] == comparison["requests"]  # every request finished
        assert comparison["completed_sim"] == comparison["requests"]
        for q in ("p50", "p90", "p99"):
            assert comparison["ttft_live"][q] > 0
            assert comparison["ttft_sim"][q] > 0
        assert comparison["e2e_live"]["p50"] > comparison["ttft_live"]["p50"]
        assert comparison["e2e_paired_median_error"] is not None
        assert comparison["itl_engine_live_s"] > 0
    assert set(data["step_models"]["just_before"]) == {"1x-load60"}
    (fit,) = data["fits"].values()
    assert fit["samples"] == 11
    for name in ("latency_cdf.png", "per_request.png", "profile_fit.png", "estimator.png"):
        assert (tmp_path / "fidelity" / name).stat().st_size > 1000
    assert (tmp_path / "fidelity" / "tiny-a_cpu.yaml").exists()
    assert (tmp_path / "fidelity" / "scenarios" / "1x-load60.yaml").exists()


def test_the_swap_timeline_keeps_the_runs_swaps_timed_from_its_start() -> None:
    """A run's swap events come from the plane's recorder: only swap starts and readiness
    since the run began (an earlier run's and evictions left out), in seconds from its start;
    the report lists each, so a late first dispatch reads as a late decision or a long load."""
    from types import SimpleNamespace
    from typing import Any

    from benchmarks.fidelity.live import _swap_events
    from benchmarks.fidelity.tables import swap_timeline
    from qlm.metrics.hooks import PlaneEvent

    events = [
        PlaneEvent(90.0, "swap", "cpu-0", "tiny-a -> tiny-b"),  # the run before
        PlaneEvent(112.0, "swap", "cpu-1", "tiny-a -> tiny-b"),
        PlaneEvent(113.0, "eviction", "cpu-1", "r1 (batch-1, evict)"),
        PlaneEvent(180.0, "swapped", "cpu-1", "tiny-a -> tiny-b: serving after 68.0 s"),
    ]
    plane: Any = SimpleNamespace(metrics=SimpleNamespace(events=events))
    got = _swap_events(plane, t0=100.0)
    assert got == [
        (12.0, "swap", "cpu-1", "tiny-a -> tiny-b"),
        (80.0, "swapped", "cpu-1", "tiny-a -> tiny-b: serving after 68.0 s"),
    ]
    run = replace(live_run(OUTCOMES, {}), swap_events=got)
    assert swap_timeline({"2x-swap": run}) == [
        "- 2x-swap: cpu-1 started at 12.0 s: tiny-a -> tiny-b",
        "- 2x-swap: cpu-1 serving at 80.0 s: tiny-a -> tiny-b: serving after 68.0 s",
    ]
    assert swap_timeline({"1x": live_run(OUTCOMES, {})}) == ["- no swap in any run"]
    assert _swap_events(SimpleNamespace(metrics=None), 0.0) == []  # type: ignore[arg-type]
