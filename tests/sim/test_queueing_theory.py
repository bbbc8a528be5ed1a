"""The simulator against queueing theory: M/M/1 and M/M/c mean waiting times.

Each engine runs one request at a time (max_batch_size 1) with a constant iteration time s and
a negligible prefill, so a request with n output tokens holds its server for n iterations
(the prefill iteration yields the first token). Output lengths are geometric with mean m, so
service times are s x Geometric(1/m): exponential up to a relative error of 1/(2m) in the second
moment (0.25% at m = 200), far inside the 5% tolerance. Arrivals are Poisson. Fixed seeds make
every run reproducible.

* M/M/1: `fcfs` on one instance (the engine's own FIFO queue).
* M/M/c: `edf` with one SLO class and equal targets, i.e. one global FIFO queue that the c
  instances pull from whenever they free (fcfs's per-arrival routing would be a different
  system, join-the-shortest-queue).

Waiting time = start of service - arrival, with service starting when the request's instance
is free: max(dispatch, the previous finish on that instance).
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest

from qlm.config import QlmConfig, SloClassConfig
from qlm.sim.events import RandomStreams
from qlm.sim.result import OutcomeState, SimResult
from qlm.sim.simulate import simulate
from qlm.types import Fleet, Request
from tests.factories import make_instance, make_profile

STEP_S = 0.005
MEAN_OUTPUT_TOKENS = 200
MEAN_SERVICE_S = STEP_S * MEAN_OUTPUT_TOKENS  # 1 s
CONFIG = QlmConfig(slo_classes=(SloClassConfig(name="q", ttft_s=1e5),), default_slo_class="q")


def erlang_c_wait_s(arrival_rate: float, mean_service_s: float, servers: int) -> float:
    """Mean waiting time in queue of M/M/c (Erlang C / (c mu - lambda))."""
    a = arrival_rate * mean_service_s  # offered load in Erlangs
    rho = a / servers
    assert rho < 1
    head = sum(a**k / math.factorial(k) for k in range(servers))
    tail = a**servers / (math.factorial(servers) * (1 - rho))
    p_wait = tail / (head + tail)
    return p_wait * mean_service_s / (servers * (1 - rho))


def exponential_fleet(servers: int) -> Fleet:
    profile = make_profile(
        step_s=(STEP_S,),
        batch_sizes=(1,),
        prefill_tokens_per_s=1e9,
        max_batch_size=1,
        output_mean=MEAN_OUTPUT_TOKENS,
        output_std=MEAN_OUTPUT_TOKENS,
    )
    return Fleet.of([make_instance(f"s{k}") for k in range(servers)], [profile])


def poisson_requests(arrival_rate: float, count: int, seed: int) -> list[Request]:
    streams = RandomStreams(seed)
    gaps = streams.generator("arrivals").exponential(1 / arrival_rate, count)
    outputs = streams.generator("outputs").geometric(1 / MEAN_OUTPUT_TOKENS, count)
    times = np.cumsum(gaps)
    return [
        Request(f"r{i}", "m7b", 1, int(n), "q", float(t), float(t) + 1e5)
        for i, (t, n) in enumerate(zip(times, outputs, strict=True))
    ]


def waits_and_services(result: SimResult) -> tuple[np.ndarray, np.ndarray]:
    by_instance: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
    for o in result.outcomes:
        assert o.state is OutcomeState.COMPLETED
        assert o.instance_id is not None
        assert o.dispatch_s is not None
        assert o.finish_s is not None
        by_instance[o.instance_id].append((o.dispatch_s, o.arrival_s, o.finish_s))
    waits: list[float] = []
    services: list[float] = []
    for runs in by_instance.values():
        free_at_s = -math.inf
        for dispatch_s, arrival_s, finish_s in sorted(runs):
            start_s = max(dispatch_s, free_at_s)
            waits.append(start_s - arrival_s)
            services.append(finish_s - start_s)
            free_at_s = finish_s
    return np.asarray(waits), np.asarray(services)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("policy", "servers", "utilisation", "count", "seed"),
    [
        ("fcfs", 1, 0.5, 200_000, 1),
        ("edf", 3, 0.7, 200_000, 1),
    ],
    ids=["M/M/1", "M/M/3"],
)
def test_mean_wait_matches_queueing_theory(
    policy: str, servers: int, utilisation: float, count: int, seed: int
) -> None:
    rate = utilisation * servers / MEAN_SERVICE_S
    requests = poisson_requests(rate, count, seed)
    result = simulate(exponential_fleet(servers), requests, policy, CONFIG, seed)
    waits, services = waits_and_services(result)
    # The engine serves n tokens in n iterations of STEP_S: service is what the model says.
    outputs = np.array([r.max_output_tokens for r in requests], dtype=np.float64)
    assert services.mean() == pytest.approx(STEP_S * outputs.mean(), rel=1e-6)
    assert services.mean() == pytest.approx(MEAN_SERVICE_S, rel=0.02)
    # Customers are FIFO: one at a time per server, never two overlapping.
    assert waits.min() >= -1e-9
    theory_s = erlang_c_wait_s(rate, MEAN_SERVICE_S, servers)
    assert waits.mean() == pytest.approx(theory_s, rel=0.05)


def test_erlang_c_reduces_to_mm1() -> None:
    # M/M/1: Wq = rho / (mu - lambda)
    assert erlang_c_wait_s(0.5, 1.0, 1) == pytest.approx(1.0)
    # M/M/2 at lambda = 1, mu = 1: C = 1/3, Wq = C / (2 - 1) = 1/3
    assert erlang_c_wait_s(1.0, 1.0, 2) == pytest.approx(1 / 3)


def test_short_mm1_run_is_in_the_right_range() -> None:
    """A quick run (not slow): few customers, wide bound; catches gross timing errors."""
    requests = poisson_requests(0.5, 3_000, 5)
    result = simulate(exponential_fleet(1), requests, "fcfs", CONFIG, 5)
    waits, services = waits_and_services(result)
    assert services.mean() == pytest.approx(MEAN_SERVICE_S, rel=0.1)
    assert 0.6 < waits.mean() < 1.5  # theory: 1.0 s
