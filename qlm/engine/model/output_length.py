"""How many tokens a request generates inside an engine (its true output length).

A Request carries max_output_tokens, the client's cap. Engines without a real model need the
actual length: the simulator's workloads put the true length in max_output_tokens ("cap");
the emulated engine draws one per request from the profile's output-length distribution
("profile"): a lognormal with the profile's mean and standard deviation, seeded by the engine's
seed and the request id (so a request gets the same length in every run, whatever the order of
arrival), at least 1 and capped by max_output_tokens (exactly that with the client's `ignore_eos`).
"""

from __future__ import annotations

import math
import random
from typing import Protocol

from qlm.perf.profile import Profile
from qlm.registry import Registry
from qlm.types import Request


class OutputLengthPolicy(Protocol):
    """Answers: how many tokens does this request generate on this profile?"""

    def output_tokens(self, request: Request, profile: Profile) -> int: ...


OUTPUT_LENGTHS: Registry[OutputLengthPolicy] = Registry("output length")


@OUTPUT_LENGTHS.register("cap")
class CapOutputLength:
    """Generate exactly max_output_tokens (the request carries its true length)."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def output_tokens(self, request: Request, profile: Profile) -> int:
        return request.max_output_tokens


@OUTPUT_LENGTHS.register("profile")
class ProfileOutputLength:
    """Draw from a lognormal with the profile's output mean and std, capped by the request;
    a request that asks to ignore end-of-sequence (`ignore_eos`) runs to its cap."""

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed

    def output_tokens(self, request: Request, profile: Profile) -> int:
        if request.ignores_eos:
            return request.max_output_tokens
        mu, sigma = lognormal_params(profile.output_tokens_mean, profile.output_tokens_std)
        rng = random.Random(f"{self.seed}:{request.id}")
        drawn = round(rng.lognormvariate(mu, sigma)) if sigma > 0 else round(math.exp(mu))
        return max(1, min(request.max_output_tokens, drawn))


def lognormal_params(mean: float, std: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and standard deviation."""
    sigma2 = math.log1p((std / mean) ** 2)
    return math.log(mean) - sigma2 / 2.0, math.sqrt(sigma2)
