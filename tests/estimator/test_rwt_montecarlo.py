"""The RWT estimator against a Monte Carlo simulation of the same queue.

The simulation is a continuous-batching engine: B slots, admission in queue order when a slot
frees, each admission costs its prefill time (the first token comes out of the prefill), and
every iteration advances all running sequences by one token in a fixed step time. Output
lengths are drawn from a Gamma distribution with the profile's mean and spread.
"""

from __future__ import annotations

import heapq

import numpy as np
import numpy.typing as npt
import pytest

from qlm.config import EstimatorConfig
from qlm.estimator import RwtEstimator
from qlm.types import Fleet
from tests.factories import make_group, make_instance, make_profile


def simulate_ttft(
    outputs: npt.NDArray[np.float64], batch: int, step_s: float, prefill_s: float
) -> npt.NDArray[np.float64]:
    """First-token times of requests served in order by a B-slot engine starting idle.

    A prefill stalls every running sequence for its duration (work-conserving GPU), so
    finish times are kept on a decode clock that excludes stalls."""
    n = len(outputs)
    ttft = np.empty(n)
    finish: list[float] = []  # decode-clock finish times of running requests
    decode_now = 0.0
    stalled_s = 0.0
    for i in range(n):
        if len(finish) >= batch:
            decode_now = max(decode_now, heapq.heappop(finish))
        stalled_s += prefill_s  # the prefill iteration produces the first token
        ttft[i] = decode_now + stalled_s
        heapq.heappush(finish, decode_now + outputs[i] * step_s)
    return ttft


def gamma_outputs(
    rng: np.random.Generator, n: int, mean: float, std: float
) -> npt.NDArray[np.float64]:
    shape = (mean / std) ** 2
    return np.maximum(1.0, rng.gamma(shape, mean / shape, size=n))


@pytest.mark.parametrize(
    ("batch", "output_std", "prefill_tokens_per_s"),
    [
        (8, 200.0, 20_000.0),  # Azure-like spread (CV 1), fast prefill
        (16, 150.0, 5_000.0),  # CV 0.75, prefill matters
        (32, 200.0, 10_000.0),  # larger batch
        (16, 100.0, 10_000.0),  # CV 0.5: the idle-start alignment offset matters
    ],
)
def test_mean_and_p95_match_monte_carlo(
    batch: int, output_std: float, prefill_tokens_per_s: float
) -> None:
    step_s = 0.03
    profile = make_profile(
        step_s=(step_s,),
        batch_sizes=(1,),
        max_batch_size=batch,
        output_mean=200.0,
        output_std=output_std,
        prefill_tokens_per_s=prefill_tokens_per_s,
    )
    instance = make_instance(memory_gib=80.0)
    estimator = RwtEstimator(EstimatorConfig(percentile=0.95), Fleet.of([instance], [profile]))
    group = make_group(size=20 * batch, prompt_tokens=500.0, output_cap=10_000.0)
    est = estimator.estimate_queue([group], instance)

    rng = np.random.default_rng(7)
    prefill_s = 500.0 / prefill_tokens_per_s
    runs = np.stack(
        [
            simulate_ttft(
                gamma_outputs(rng, group.size, 200.0, output_std), batch, step_s, prefill_s
            )
            for _ in range(400)
        ]
    )
    mc_mean = runs.mean(axis=0)
    deep = slice(4 * batch, None)  # requests that waited on at least 3B completions
    rel_err = np.abs(est.ttft_mean_s[deep] - mc_mean[deep]) / mc_mean[deep]
    # The normal approximation's mean is within 5% of the simulated mean for every deep request.
    assert rel_err.max() < 0.05, rel_err.max()
    # The p95 bound covers between 90% and 99% of simulated outcomes, over all waiting requests.
    waiting = slice(batch, None)
    covered = (runs[:, waiting] <= est.ttft_p_s[waiting]).mean()
    assert 0.90 <= covered <= 0.99, covered
