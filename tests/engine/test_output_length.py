"""Output-length policies: the cap, and seeded draws from the profile's distribution."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace

import pytest

from qlm.engine.model.output_length import OUTPUT_LENGTHS, lognormal_params
from qlm.registry import UnknownPolicyError
from tests.factories import make_profile, make_request


def test_cap_generates_max_output_tokens() -> None:
    policy = OUTPUT_LENGTHS.create("cap")
    assert policy.output_tokens(make_request(max_output_tokens=77), make_profile()) == 77


def test_profile_draws_are_seeded_per_request_and_capped() -> None:
    profile = make_profile(output_mean=200.0, output_std=150.0)
    a, b = OUTPUT_LENGTHS.create("profile", seed=1), OUTPUT_LENGTHS.create("profile", seed=1)
    requests = [make_request(id=f"q{i}", max_output_tokens=100_000) for i in range(4000)]
    first = [a.output_tokens(r, profile) for r in requests]
    assert first == [b.output_tokens(r, profile) for r in reversed(requests)][::-1]
    assert min(first) >= 1
    assert statistics.fmean(first) == pytest.approx(200.0, rel=0.05)
    assert statistics.pstdev(first) == pytest.approx(150.0, rel=0.15)
    other = OUTPUT_LENGTHS.create("profile", seed=2)
    assert [other.output_tokens(r, profile) for r in requests[:50]] != first[:50]
    capped = [
        a.output_tokens(make_request(id=r.id, max_output_tokens=50), profile) for r in requests
    ]
    assert max(capped) == 50


def test_lognormal_parameters_reproduce_mean_and_std() -> None:
    mu, sigma = lognormal_params(211.0, 163.0)
    mean = math.exp(mu + sigma**2 / 2)
    std = math.sqrt((math.exp(sigma**2) - 1) * math.exp(2 * mu + sigma**2))
    assert (mean, std) == (pytest.approx(211.0), pytest.approx(163.0))


def test_unknown_policy_lists_the_known_ones() -> None:
    with pytest.raises(UnknownPolicyError, match="known: cap, profile"):
        OUTPUT_LENGTHS.create("oracle")


def test_a_request_that_ignores_eos_runs_to_its_cap() -> None:
    policy = OUTPUT_LENGTHS.create("profile", seed=1)
    profile = make_profile(output_mean=20.0, output_std=5.0)
    requests = [make_request(id=f"q{i}", max_output_tokens=500) for i in range(50)]
    assert max(policy.output_tokens(r, profile) for r in requests) < 500
    exact = [replace(r, sampling={"ignore_eos": True}) for r in requests]
    assert {policy.output_tokens(r, profile) for r in exact} == {500}
