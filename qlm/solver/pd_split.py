"""How many of a model's instances should prefill and how many decode (the prefill/decode split
of DistServe and Prophet; the simulator's qlm/sim/handoff.py carries the KV between them)?

Question answered: given the instances that serve one model and its traffic (arrival rate,
mean prompt and output tokens), which split balances the two phases' load?

Each instance's capacity for a phase comes from its profile on its GPU type:

* prefill: prompt tokens per second, prompts of the mean length one after another
  (`Profile.iteration_s`: the step's fixed cost, its cost per prompt token and over context);
* decode: output tokens per second at the batch its KV holds, `batch / iteration_s` of a
  decode step over that batch's context, with batch = the sequences of the traffic's mean
  decoding context (`PhaseDemand.decode_context_tokens_mean`) its KV cache fits, at most the
  profile's `max_batch_size` (`Profile.batch_size_for`).

A split's utilization of a phase is the phase's demand (arrival rate x mean prompt, or x mean
output, tokens per second) over the summed capacity of its pool. `choose_split` takes the split
whose busier pool is least busy (DistServe's goodput-optimal placement balances the phases the
same way; it searches with a simulator, this prices each split in closed form), ties to fewer
prefill instances. Instances of one GPU type are interchangeable, so the candidates are the
counts per type: at most the product of (instances of a type + 1) splits.

What it does not decide: whether to split at all (a co-located instance does both phases, and
interference is what a split buys off; benchmarks/disagg.py measures it), nor roles over time
(the split is chosen once, from the traffic given).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from qlm.perf.profile import Profile
from qlm.types import Instance, Request


@dataclass(frozen=True, slots=True)
class PhaseDemand:
    """One model's traffic, as the split needs it. `decode_context_tokens_mean`: the context a
    decoding sequence holds on average over its decode time, E[(prompt + output / 2) x output]
    / E[output] (a long request holds its long context for its many steps: weighting by output
    is what the KV sees, by Little's law). `remote_prompt_share`: the share of prompt tokens
    the router sends to prefill instances (those of prompts longer than its local limit, as
    `disagg` routes them); the rest is prefilled where it decodes."""

    arrival_rate_per_s: float
    prompt_tokens_mean: float
    output_tokens_mean: float
    decode_context_tokens_mean: float
    remote_prompt_share: float = 1.0

    @classmethod
    def of(cls, requests: Sequence[Request], max_local_prefill_tokens: int = 0) -> PhaseDemand:
        """From a trace of one model's requests (their spread of arrival times; output: each
        request's max_output_tokens, what a trace's request made), routed as a router that
        prefills prompts of at most `max_local_prefill_tokens` where they decode."""
        if not requests:
            return cls(0.0, 0.0, 0.0, 0.0)
        times = [r.arrival_at_s for r in requests]
        span_s = max(times) - min(times)
        rate = len(requests) / span_s if span_s > 0 else float(len(requests))
        prompts = sum(r.prompt_tokens for r in requests)
        remote = sum(
            r.prompt_tokens for r in requests if r.prompt_tokens > max_local_prefill_tokens
        )
        outputs = sum(r.max_output_tokens for r in requests)
        held = sum(
            (r.prompt_tokens + r.max_output_tokens / 2) * r.max_output_tokens for r in requests
        )
        context = held / outputs if outputs else prompts / len(requests)
        share = remote / prompts if prompts else 1.0
        return cls(rate, prompts / len(requests), outputs / len(requests), context, share)


@dataclass(frozen=True, slots=True)
class SplitChoice:
    """The instances to prefill (the others decode) and each pool's utilization."""

    prefill_ids: tuple[str, ...]
    decode_ids: tuple[str, ...]
    prefill_utilization: float
    decode_utilization: float

    @property
    def bottleneck_utilization(self) -> float:
        return max(self.prefill_utilization, self.decode_utilization)


def prefill_capacity_tokens_per_s(profile: Profile, demand: PhaseDemand) -> float:
    """Prompt tokens per second prefilling prompts of the mean length one after another (the
    profile's iteration time: its fixed cost, per token and over the prompt's own context)."""
    prompt = max(1.0, demand.prompt_tokens_mean)
    return prompt / profile.iteration_s(prompt, 0, prompt)


def decode_capacity_tokens_per_s(
    profile: Profile, instance: Instance, demand: PhaseDemand
) -> float:
    """Output tokens per second at the batch the instance's KV holds for this traffic, each
    step over that batch's whole context (long prompts make decode steps slower, not only
    fewer)."""
    context = max(1.0, demand.decode_context_tokens_mean)
    batch = profile.batch_size_for(instance.gpu_memory_bytes, context)
    return batch / profile.iteration_s(0, batch, batch * context)


def choose_split(
    instances: Sequence[Instance],
    profiles: Mapping[tuple[str, str], Profile],
    model: str,
    demand: PhaseDemand,
) -> SplitChoice | None:
    """The split of `instances` (all able to hold `model`) whose busier pool is least busy;
    None for fewer than two instances (a split needs one of each)."""
    by_type: dict[str, list[Instance]] = {}
    for instance in instances:
        by_type.setdefault(instance.gpu_type, []).append(instance)
    if len(instances) < 2:
        return None
    best: tuple[float, int, SplitChoice] | None = None
    for counts in itertools.product(*(range(len(group) + 1) for group in by_type.values())):
        prefill = [i for group, k in zip(by_type.values(), counts, strict=True) for i in group[:k]]
        decode = [i for group, k in zip(by_type.values(), counts, strict=True) for i in group[k:]]
        if not prefill or not decode:
            continue
        choice = _price(prefill, decode, profiles, model, demand)
        key = (choice.bottleneck_utilization, len(prefill), choice)
        if best is None or key[:2] < best[:2]:
            best = key
    return None if best is None else best[2]


def _price(
    prefill: Sequence[Instance],
    decode: Sequence[Instance],
    profiles: Mapping[tuple[str, str], Profile],
    model: str,
    demand: PhaseDemand,
) -> SplitChoice:
    def prefill_cap(pool: Sequence[Instance]) -> float:
        return sum(
            prefill_capacity_tokens_per_s(profiles[(model, i.gpu_type)], demand) for i in pool
        )

    decode_cap = sum(
        decode_capacity_tokens_per_s(profiles[(model, i.gpu_type)], i, demand) for i in decode
    )
    prompt_per_s = demand.arrival_rate_per_s * demand.prompt_tokens_mean
    remote = demand.remote_prompt_share
    # a decode instance also prefills the prompts kept local: its time goes to both
    local_load = prompt_per_s * (1 - remote) / prefill_cap(decode)
    return SplitChoice(
        prefill_ids=tuple(i.id for i in prefill),
        decode_ids=tuple(i.id for i in decode),
        prefill_utilization=prompt_per_s * remote / prefill_cap(prefill),
        decode_utilization=demand.arrival_rate_per_s * demand.output_tokens_mean / decode_cap
        + local_load,
    )
