"""One wait predictor, two planes: the simulator's forecast (`SimDispatch.predict`, over the
simulation's exact state) and the API's (`QueueForecaster`, over the queue it reads and the
agents' status reports) are given one queue and fleet state and a new arrival, and must
forecast its first token alike."""

from __future__ import annotations

import random

import pytest

from qlm.agents.agent_reports import instance_status
from qlm.agents.decision import Forecast
from qlm.api.wait_forecast import QueueForecaster
from qlm.queue.memory import MemoryQueue
from qlm.sim.policies.qlm_dispatch import SimDispatch
from tests.agents.test_one_decision import PRIORITY, TTFT_S, draw_state
from tests.factories import make_request


async def forecasts(seed: int) -> tuple[Forecast | None, Forecast | None, int]:
    """(the API's forecast, the simulator's, how many requests were queued before it)."""
    rng = random.Random(seed)
    now_s = 1000.0
    sim = draw_state(rng, now_s)
    queue = MemoryQueue()
    simulated = SimDispatch(sim, PRIORITY, members=10_000)  # type: ignore[arg-type]
    for request in sorted(sim.requests.values(), key=lambda r: r.arrival_at_s):
        simulated.arrived(request)
        simulated.queue(request)
        await queue.enqueue(request)
    for i, obs in sim.observations.items():
        profile = None if obs.model is None else sim.fleet.profile(obs.model, sim.fleet.instance(i))
        await queue.report_instance(instance_status(i, obs, profile, 0.0, PRIORITY, now_s))
    slo = rng.choice(list(TTFT_S))
    ttft_s = TTFT_S[slo] if rng.random() < 0.6 else rng.uniform(0.2, 4.0)  # tight: may drop
    arrival = make_request(
        model=rng.choice(("m7b", "m13b")), slo_class=slo, prompt_tokens=rng.randint(20, 4000),
        max_output_tokens=rng.randint(5, 600), arrival_at_s=now_s, ttft_s=ttft_s,
    )  # fmt: skip
    api = QueueForecaster(queue, sim.fleet, PRIORITY, sim.clock, 1.0, 0.5)
    live = await api.forecast(arrival)
    sim.requests[arrival.id] = arrival
    simulated.queue(arrival)
    prediction = simulated.predict(arrival)
    want = None if prediction is None else Forecast(prediction.predicted_s)
    return live, want, len(sim.requests) - 1


@pytest.mark.parametrize("seed", range(30))
async def test_the_api_forecasts_what_the_simulator_grades(seed: int) -> None:
    live, simulated, _ = await forecasts(seed)
    if simulated is None or simulated.first_token_s is None:
        assert live == simulated
    else:
        assert live is not None
        assert live.first_token_s is not None
        assert live.first_token_s == pytest.approx(simulated.first_token_s, rel=1e-9, abs=1e-9)


async def test_the_states_exercise_every_answer() -> None:
    """The random states give forecasts behind a queue, predicted misses and none."""
    got = [await forecasts(s) for s in range(30)]
    assert any(f is not None and f.first_token_s is not None and n > 0 for f, _, n in got)
    assert any(f is not None and f.first_token_s is None for f, _, _ in got)
    assert any(f is None for f, _, _ in got)
