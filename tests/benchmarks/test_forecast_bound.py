"""benchmarks/forecast_bound.py grades the bound alone: the level it varies changes no forecast
and no decision (the same requests bounded, the same attainment), and its summary counts the
class-runs under the criterion."""

from __future__ import annotations

from benchmarks.forecast_bound import grade, summary


def test_the_level_changes_the_bound_only() -> None:
    fixed = grade("random:0", 0, 0.0)
    adaptive = grade("random:0", 0, 0.005)
    assert set(fixed) == set(adaptive)
    for cls in fixed:  # a bound exists from the same count of scores either way
        assert fixed[cls]["bounded"] == adaptive[cls]["bounded"]
        for figures in (fixed[cls], adaptive[cls]):
            held = figures["bound_held"]
            assert held is None or 0.0 <= held <= 1.0


def test_the_summary_counts_class_runs_under_the_criterion() -> None:
    def case(name: str, held: float) -> dict[str, object]:
        figures = {"a": {"bounded": 10, "bound_held": held, "width": 1.0}}
        return {"case": name, "seed": 0, "fixed": figures, "adaptive": figures}

    lines = summary([case("wc-quick", 0.5), case("wa-quick", 0.9), case("random:3", 0.84)])
    assert lines[0].startswith("- quick scenarios, fixed level: 1 of 2 class-runs")
    assert "random scenarios, adaptive level: 1 of 1 class-runs" in lines[3]
    assert "lowest 84.0 %" in lines[3]
