"""Wait-prediction accuracy (qlm/sim/report/prediction.py): the numbers follow from the
predictions and outcomes, and qlm's predictions on a light load are close."""

from __future__ import annotations

import pytest

from qlm.sim.report.prediction import prediction_accuracy
from qlm.sim.result import OutcomeState, RequestOutcome, SimResult, TtftPrediction
from qlm.sim.simulate import simulate
from tests.sim.cases import CONFIG, mixed_requests, two_model_fleet


def _outcome(rid: str, cls: str, ttft_s: float | None, met: bool) -> RequestOutcome:
    first = None if ttft_s is None else ttft_s
    deadline = 100.0 if met else 0.0
    return RequestOutcome(
        rid, cls, "m", "i", 0.0, 0.0, first, 1.0 + (first or 0.0), deadline, None, 0,
        OutcomeState.COMPLETED if first is not None else OutcomeState.UNFINISHED,
    )  # fmt: skip


def _result(
    outcomes: tuple[RequestOutcome, ...], predictions: dict[str, TtftPrediction]
) -> SimResult:
    return SimResult(
        "p", 0, ("interactive", "batch-1"), outcomes, (), (), {}, 0, (), 0, 0.0, 1.0, 0.0,
        ttft_predictions=predictions,
    )  # fmt: skip


def test_accuracy_counts_errors_by_class_band_and_predicted_misses() -> None:
    outcomes = (
        _outcome("a", "interactive", 2.0, True),
        _outcome("b", "interactive", 10.0, True),
        _outcome("c", "batch-1", None, False),
    )
    predictions = {
        "a": TtftPrediction(1.0, 500),
        "b": TtftPrediction(3.0, 20_000),
        "c": TtftPrediction(None, 500),
    }
    acc = prediction_accuracy(_result(outcomes, predictions))
    assert acc is not None
    assert acc["overall"]["requests"] == 2
    assert acc["overall"]["median_abs_error_s"] == pytest.approx(4.0)  # |1| and |7|
    assert acc["overall"]["within_2x"] == 0.5  # 2 <= 2*1+1; 10 > 2*3+1
    assert acc["overall"]["predicted_miss"] == 1
    assert acc["overall"]["predicted_miss_held"] == 1.0
    assert acc["by_prompt_band"]["<1k"]["median_abs_error_s"] == pytest.approx(1.0)
    assert acc["by_prompt_band"][">=8k"]["median_abs_error_s"] == pytest.approx(7.0)
    assert list(acc["by_class"]) == ["interactive", "batch-1"]
    assert prediction_accuracy(_result(outcomes, {})) is None


def test_qlm_predicts_every_arrival_and_is_close_on_a_light_load() -> None:
    requests = mixed_requests(150, 5.0, 3)
    result = simulate(two_model_fleet(), requests, "qlm-edf", CONFIG, 1)
    assert set(result.ttft_predictions) == {r.id for r in requests}
    acc = prediction_accuracy(result)
    assert acc is not None
    assert acc["overall"]["median_abs_error_s"] < 2.0  # 1.5 s: it leaves out the first step
    assert acc["overall"]["within_2x"] >= 0.9
    assert simulate(two_model_fleet(), requests, "edf", CONFIG, 1).ttft_predictions == {}
