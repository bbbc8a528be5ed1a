"""The prefill/decode split chooser (qlm/solver/pd_split.py) against the simulator: on traffic
whose right split is plain (long prompts and one-token answers; short prompts and long
answers), the split it prices best is the one the simulated `disagg` serves fastest."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from qlm.config import QlmConfig
from qlm.sim.simulate import simulate
from qlm.solver.pd_split import PhaseDemand, choose_split
from qlm.types import Fleet, InstanceRole, Request
from tests.factories import make_instance, make_profile

PROFILE = make_profile("m7b", "A100")
FLEET = tuple(make_instance(f"i{k}") for k in range(4))


def traffic(prompt: int, output: int, rate_per_s: float, count: int = 300) -> list[Request]:
    times = np.cumsum(np.random.default_rng(0).exponential(1 / rate_per_s, count))
    return [
        Request(f"r{k}", "m7b", prompt, output, "interactive", float(t), float(t) + 5.0)
        for k, t in enumerate(times)
    ]


def split(prefill: int) -> Fleet:
    roles = [InstanceRole.PREFILL] * prefill + [InstanceRole.DECODE] * (len(FLEET) - prefill)
    return Fleet.of([replace(i, role=r) for i, r in zip(FLEET, roles, strict=True)], [PROFILE])


def mean_latency_s(fleet: Fleet, requests: list[Request]) -> float:
    options = {"max_local_prefill_tokens": 0}  # every prompt to the prefill pool
    result = simulate(fleet, requests, "disagg", QlmConfig(), 0, policy_options=options)
    return float(np.mean([o.finish_s - o.arrival_s for o in result.outcomes if o.finish_s]))


@pytest.mark.parametrize(
    ("prompt", "output", "rate_per_s", "prefill"),
    [(6000, 20, 4.0, 3), (200, 800, 3.0, 1)],
    ids=["prefill-heavy", "decode-heavy"],
)
def test_the_split_priced_best_is_the_one_served_fastest(
    prompt: int, output: int, rate_per_s: float, prefill: int
) -> None:
    requests = traffic(prompt, output, rate_per_s)
    choice = choose_split(FLEET, {("m7b", "A100"): PROFILE}, "m7b", PhaseDemand.of(requests))
    assert choice is not None
    assert len(choice.prefill_ids) == prefill
    latency = {k: mean_latency_s(split(k), requests) for k in (1, 2, 3)}
    assert min(latency, key=latency.__getitem__) == prefill


def test_prompts_kept_local_load_the_decode_pool_and_a_split_needs_two() -> None:
    long_and_short = [*traffic(6000, 20, 2.0), *traffic(500, 20, 2.0)]
    shared = {("m7b", "A100"): PROFILE}
    remote = PhaseDemand.of(long_and_short)
    local = PhaseDemand.of(long_and_short, max_local_prefill_tokens=1000)
    assert remote.remote_prompt_share == 1.0
    assert local.remote_prompt_share == pytest.approx(6000 / 6500, rel=0.05)
    everything = choose_split(FLEET, shared, "m7b", remote)
    kept = choose_split(FLEET, shared, "m7b", local)
    assert everything is not None
    assert kept is not None
    assert kept.prefill_utilization < everything.prefill_utilization
    assert choose_split(FLEET[:1], shared, "m7b", remote) is None


def test_kv_weighted_context_counts_long_requests_for_their_many_steps() -> None:
    demand = PhaseDemand.of(
        [Request("a", "m", 100, 10, "x", 0.0, 1.0), Request("b", "m", 10_000, 1000, "x", 1.0, 2.0)]
    )
    # (100 + 5) x 10 + (10,000 + 500) x 1,000 over 1,010 output tokens
    assert demand.decode_context_tokens_mean == pytest.approx((1050 + 10_500_000) / 1010)
    assert demand.prompt_tokens_mean == 5050
