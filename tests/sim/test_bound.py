"""The clairvoyant bound (qlm/sim/bound.py): tight for a lone request, below 1 where deadlines
cannot be met alone or together, and never below what a policy attains."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from qlm.config import PlannerConfig, QlmConfig, SloClassConfig
from qlm.config.profile_files import profile_named
from qlm.sim.bound import AttainmentBound, attainment_bound, request_limits
from qlm.sim.simulate import simulate
from qlm.types import Fleet, PrefixBlock, Request, SloClass
from tests.factories import make_instance, make_request
from tests.sim.cases import two_model_fleet

POLICIES = ("fcfs", "edf", "shepherd", "llmd", "qlm")
TIGHT = (
    SloClassConfig(name="tight", ttft_s=0.4, priority=2, lateness_weight=100),
    SloClassConfig(name="loose", ttft_s=3.0, completion_s=8.0, priority=1),
)
CONFIG = QlmConfig(
    slo_classes=TIGHT,
    default_slo_class="loose",
    planner=PlannerConfig(time_limit_s=0.2, threads=1),
)
SLO = {c.name: c.to_slo_class() for c in TIGHT}


def mistral_fleet(a100: int = 1, a10: int = 0) -> Fleet:
    """Packaged Mistral-7B profiles (with a step-time model) on A100s and A10s."""
    instances = [make_instance(f"a100-{k}", "A100", loaded_model="mistral-7b") for k in range(a100)]
    instances += [
        make_instance(f"a10-{k}", "A10", memory_gib=24.0, loaded_model="mistral-7b")
        for k in range(a10)
    ]
    profiles = [profile_named("mistral-7b", "A100"), profile_named("mistral-7b", "A10")]
    return Fleet.of(instances, profiles)


def check_policies_within(
    fleet: Fleet, requests: list[Request], config: QlmConfig, bound: AttainmentBound
) -> list[float]:
    attained = []
    for policy in POLICIES:
        result = simulate(fleet, requests, policy, config, seed=0)
        assert result.attainment() <= bound.overall + 1e-12, policy
        for name, value in result.attainment_by_class().items():
            assert value <= bound.by_class[name] + 1e-12, (policy, name)
        attained.append(result.attainment())
    return attained


@pytest.mark.parametrize("fleet", [mistral_fleet(), two_model_fleet()], ids=["step", "table"])
def test_a_lone_request_on_an_idle_fleet_is_bounded_by_one_and_every_policy_gets_it(
    fleet: Fleet,
) -> None:
    model = fleet.instances[0].loaded_model or ""
    requests = [make_request(model=model, prompt_tokens=900, max_output_tokens=50, ttft_s=2.0)]
    bound = attainment_bound(fleet, requests, QlmConfig())
    assert bound.as_dict() == {"overall": 1.0, "interactive": 1.0}
    assert bound.infeasible == 0
    assert check_policies_within(fleet, requests, QlmConfig(), bound) == [1.0] * len(POLICIES)


@pytest.mark.parametrize("prompt_tokens", [4096, 3000, 100])
def test_earliest_first_token_is_what_an_idle_engine_gives(prompt_tokens: int) -> None:
    # Whole chunks: the lower bound is exactly the engine's time; a partial chunk last: below.
    fleet = mistral_fleet()
    requests = [make_request(model="mistral-7b", prompt_tokens=prompt_tokens, arrival_at_s=3.0)]
    limits = request_limits(fleet, requests)
    result = simulate(fleet, requests, "fcfs", QlmConfig(), seed=0)
    first_token_s = result.outcomes[0].first_token_s
    assert first_token_s is not None
    assert limits.first_token_s[0] <= first_token_s + 1e-12
    if prompt_tokens % 2048 == 0 or prompt_tokens < 2048:
        assert limits.first_token_s[0] == pytest.approx(first_token_s, rel=1e-12)


def test_a_deadline_shorter_than_one_prefill_is_infeasible() -> None:
    fleet = mistral_fleet()
    fast = SloClass("interactive", ttft_s=0.001)  # a 2,000-token prefill takes ~0.1 s
    requests = [
        Request.create("hopeless", "mistral-7b", 2000, 20, fast, 0.0),
        make_request(model="mistral-7b", prompt_tokens=200, slo_class="batch-1", ttft_s=60.0),
    ]
    bound = attainment_bound(fleet, requests, QlmConfig())
    assert bound.infeasible == 1
    assert bound.as_dict() == {"overall": 0.5, "interactive": 0.0, "batch-1": 1.0}
    check_policies_within(fleet, requests, QlmConfig(), bound)


def test_a_model_no_instance_holds_costs_a_load_first() -> None:
    fleet = two_model_fleet(num_7b=1, num_13b=0, load_s=5.0)  # m13b needs a 5 s load
    short = SloClass("interactive", ttft_s=2.0)
    requests = [
        Request.create("soon", "m13b", 100, 5, short, 0.0),
        Request.create("later", "m13b", 100, 5, short, 4.0),  # the load ends at 5 s < 6 s
    ]
    bound = attainment_bound(fleet, requests, QlmConfig())
    assert bound.overall == 0.5
    check_policies_within(fleet, requests, QlmConfig(), bound)


def test_simultaneous_requests_beyond_the_fleets_prefill_capacity_are_counted() -> None:
    # Ten 2,000-token prompts at once on one A10, each alone served in ~0.28 s < 0.4 s: one
    # fits by its deadline, a second would need ~0.56 s of prefill work.
    fleet = mistral_fleet(a100=0, a10=1)
    requests = [
        Request.create(f"r{k}", "mistral-7b", 2000, 10, SLO["tight"], 0.0) for k in range(10)
    ]
    bound = attainment_bound(fleet, requests, CONFIG)
    assert bound.infeasible == 0
    assert bound.capacity_excluded == 9
    assert bound.overall == pytest.approx(0.1)
    assert max(check_policies_within(fleet, requests, CONFIG, bound)) == pytest.approx(0.1)


def random_case(seed: int) -> tuple[Fleet, list[Request]]:
    """Even seeds: Mistral on A100s and A10s (step-time profiles); odd: two models on A100s
    with table profiles, one of them loaded nowhere at first when the draw says so."""
    rng = np.random.default_rng(seed)
    if seed % 2 == 0:
        fleet = mistral_fleet(a100=int(rng.integers(0, 2)), a10=int(rng.integers(1, 3)))
        models = ("mistral-7b",)
    else:
        fleet = two_model_fleet(int(rng.integers(1, 3)), int(rng.integers(0, 2)), load_s=1.0)
        models = ("m7b", "m13b")
    count = int(rng.integers(10, 30))
    times = np.sort(rng.uniform(0.0, 4.0, count))
    requests = [
        Request.create(
            f"r{k}",
            models[int(rng.integers(len(models)))],
            int(rng.integers(50, 4000)),
            int(rng.integers(1, 300)),
            SLO["tight" if rng.random() < 0.6 else "loose"],
            float(at_s),
        )
        for k, at_s in enumerate(times)
    ]
    return fleet, requests


@pytest.mark.parametrize("seed", range(10))
def test_no_policy_beats_the_bound_on_random_small_scenarios(seed: int) -> None:
    fleet, requests = random_case(seed)
    bound = attainment_bound(fleet, requests, CONFIG)
    assert 0.0 <= bound.overall <= 1.0
    check_policies_within(fleet, requests, CONFIG, bound)


def test_a_models_requests_get_only_the_instances_that_can_serve_it() -> None:
    # Vicuna-13B fits only the A100: ten 2,000-token prompts at once (~0.2 s of prefill work
    # each) share its 0.4 s, not the whole fleet's 3 x 0.4 s.
    instances = [make_instance("a100", "A100", loaded_model="vicuna-13b")]
    instances += [
        make_instance(f"a10-{k}", "A10", memory_gib=24.0, loaded_model="mistral-7b")
        for k in range(2)
    ]
    profiles = [profile_named(m, g) for m, g in (("vicuna-13b", "A100"), ("mistral-7b", "A10"))]
    fleet = Fleet.of(instances, profiles)
    requests = [
        Request.create(f"v{k}", "vicuna-13b", 2000, 10, SLO["tight"], 0.0) for k in range(10)
    ]
    requests.append(Request.create("m", "mistral-7b", 100, 10, SLO["loose"], 0.0))
    bound = attainment_bound(fleet, requests, CONFIG)
    assert bound.by_class == {"tight": pytest.approx(0.2), "loose": 1.0}
    assert bound.overall == pytest.approx(3 / 11)
    check_policies_within(fleet, requests, CONFIG, bound)


def with_shared_prefixes(requests: list[Request], seed: int) -> list[Request]:
    """Each request opens with one of three chains of shared blocks (or none), as long as its
    prompt allows: the cache lets policies compute less, and the bound must know it."""
    rng = np.random.default_rng(seed + 1000)
    chains = (((1, 1500), (2, 1000)), ((1, 1500), (3, 500)), ((4, 2000),), ())
    out = []
    for request in requests:
        blocks = chains[int(rng.integers(len(chains)))]
        prompt = request.prompt_tokens + sum(tokens for _, tokens in blocks)
        prefix = tuple(PrefixBlock(key, tokens) for key, tokens in blocks)
        out.append(replace(request, prompt_tokens=prompt, prefix=prefix))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_no_policy_beats_the_bound_when_prompts_share_prefixes(seed: int) -> None:
    fleet, requests = random_case(seed)
    requests = with_shared_prefixes(requests, seed)
    bound = attainment_bound(fleet, requests, CONFIG)
    check_policies_within(fleet, requests, CONFIG, bound)


def test_a_prefix_seen_before_shortens_the_earliest_first_token() -> None:
    fleet = mistral_fleet()
    first = make_request(model="mistral-7b", prompt_tokens=4096)
    second = make_request(model="mistral-7b", prompt_tokens=4096, arrival_at_s=10.0)
    plain = request_limits(fleet, [first, second]).first_token_s
    prefix = (PrefixBlock(7, 4000),)
    shared = [replace(first, prefix=prefix), replace(second, id="r2", prefix=prefix)]
    limits = request_limits(fleet, shared).first_token_s
    assert limits[0] == plain[0]  # nothing was cached before the first
    assert limits[1] - 10.0 < (plain[1] - 10.0) / 10  # the second computes 96 tokens
    # given out of arrival order, the later request is still the one that finds it cached
    assert list(request_limits(fleet, shared[::-1]).first_token_s) == list(limits[::-1])
