"""Plots with nothing to show say so, on a zero-based axis: no results, a policy with no
requests, no tokens at all, nobody ever waiting, no swaps, an all-zero or empty sweep."""

from __future__ import annotations

from pathlib import Path

import pytest
from matplotlib.figure import Figure

from qlm.sim.report import plot_attainment, plot_queue, plot_swaps, plot_sweep, plot_ttft_cdf
from qlm.sim.result import OutcomeState, QueueSample, SimResult
from tests.sim.test_report import outcome

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def bare(policy: str, *, requests: int = 0, waiting: int = 0, swaps: int = 0) -> SimResult:
    """A result whose requests never produced a token (or no requests at all)."""
    outcomes = tuple(
        outcome(f"r{k}", "interactive", 0.0, None, None, 20.0, None, OutcomeState.FAILED)
        for k in range(requests)
    )
    return SimResult(
        policy=policy,
        seed=0,
        slo_classes=("interactive",),
        outcomes=outcomes,
        interrupted=(),
        loads=(),
        swaps={"i0": swaps},
        evictions=0,
        queue_samples=tuple(QueueSample(float(t), (waiting,)) for t in range(3)),
        events_processed=0,
        start_s=0.0,
        end_s=0.0,
        sim_wall_s=0.0,
    )


def texts(fig: Figure) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts]


def assert_no_negative_axis(fig: Figure) -> None:
    for ax in fig.axes:
        bottom, top = ax.get_ylim()
        assert 0 <= bottom < top


# e.g. "No artists with labels found to put in legend" from an empty legend
pytestmark = pytest.mark.filterwarnings("error::UserWarning")


@pytest.mark.parametrize("results", [[], [bare("fcfs")], [bare("fcfs", requests=2)]])
def test_every_plot_of_a_run_without_tokens_says_so(
    tmp_path: Path, results: list[SimResult]
) -> None:
    figures = {
        "attainment": plot_attainment(tmp_path / "a.png", results),
        "ttft": plot_ttft_cdf(tmp_path / "t.png", results, {"interactive": 20.0}),
        "queue": plot_queue(tmp_path / "q.png", results),
        "swaps": plot_swaps(tmp_path / "s.png", results),
    }
    for name in ("a", "t", "q", "s"):
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == PNG_MAGIC
    for fig in figures.values():
        assert_no_negative_axis(fig)
    assert any(t.startswith("no ") for t in texts(figures["ttft"]))
    assert any(t.startswith("no ") for t in texts(figures["queue"]))
    assert any(t.startswith("no ") for t in texts(figures["swaps"]))
    if not any(r.num_requests for r in results):
        assert "no requests: nothing to attain" in texts(figures["attainment"])


def test_a_policy_without_requests_of_a_class_is_marked_not_zero(tmp_path: Path) -> None:
    served = bare("fcfs", requests=1)
    empty = bare("edf")
    fig = plot_attainment(tmp_path / "a.png", [served, empty])
    assert texts(fig).count("n/a") == 2  # edf: overall and interactive
    assert_no_negative_axis(fig)


def test_queue_and_swaps_with_data_start_at_zero(tmp_path: Path) -> None:
    busy = bare("fcfs", requests=1, waiting=3, swaps=2)
    for fig in (plot_queue(tmp_path / "q.png", [busy]), plot_swaps(tmp_path / "s.png", [busy])):
        assert texts(fig) == []
        assert fig.axes[0].get_ylim()[0] == 0


@pytest.mark.parametrize(
    ("series", "message"),
    [
        ({}, "no data"),
        ({"fcfs": [0.0, 0.0]}, "every value is 0"),
        ({"x": [float("nan")] * 2}, "no data"),
    ],
)
def test_sweep_without_positive_values_says_so(
    tmp_path: Path, series: dict[str, list[float]], message: str
) -> None:
    fig = plot_sweep(tmp_path / "w.png", [0.5, 2.0], series, "throughput")
    assert message in texts(fig)
    assert_no_negative_axis(fig)
