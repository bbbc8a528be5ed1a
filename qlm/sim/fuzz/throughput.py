"""How many requests per second can a fleet serve? An analytic estimate from the profiles, used
to set a random scenario's load as a multiple of its fleet's capacity.

One instance of a profile, saturated (a backlog, so the engine always holds as many sequences
as its KV cache or max_batch_size allows), spends on a request with prompt P and output O
tokens, by the linear step-time model (qlm/perf/step.py):

    prefill   P x (per_prefill_token_s + per_context_token_s)       (one chunk)
    decode    O x per_decode_seq_s + per_context_token_s x (O P + O^2 / 2)
    base      O x base_s / B      (each decode step's fixed cost, shared by the B in the batch)

with B = min(max_batch_size, KV tokens / the time-weighted mean context E[O (P + O/2)] / E[O]).
The instance serves 1 / E[cost] requests per second of the length distribution.

Checked against capacities measured by simulation (a backlog under fcfs on one instance,
throughput = requests / makespan, so the draining tail makes the measurement a little low):
sims/README.md's table, Azure lengths: Mistral-7B A100 10.93 estimated vs 10.75 measured
(+1.7%), A10 3.05 vs 2.90 (+5%), Vicuna-13B A100 3.42 vs 3.28 (+4%), Llama-70B 4 x A100 2.33
vs 2.26 (+3%); Mistral-7B with 16k-60k-token Mooncake prompts A100 0.44 vs 0.42 (+5%), A10
0.10 vs 0.08 (+27%: two such sequences fill its KV cache, so prefills stall decoding more than
the mean says). Measured for this module (backlogs of 1,500-10,000): Mistral-7B H100 23.6 vs
23.3 (+1%), Vicuna-13B H100 6.73 vs 6.44 (+4.5%), Llama-70B 4 x H100 4.93 vs 4.88 (+1%),
Vicuna-13B A100 Mooncake prompts <= 56k 0.290 vs 0.266 (+9%), Mistral-7B A100 Azure prompts
>= 2,000 4.85 vs 4.62 (+5%), Mistral-7B A10 Azure prompts <= 512 13.1 vs 11.8 (+11%). The
estimate is optimistic: by 1-5% on ordinary lengths, ~10% on short or long prompts and up to
~30% where the KV cache holds only a few requests; a scenario's nominal load factor is below
its true one by as much.

A fleet's capacity for a mix of models (`fleet_capacity_per_s`) is the largest total rate R
such that R x share(m) of every model m can be served when each instance splits its time among
the models it can run (a fractional placement, found by a linear program): the rate that the
best placement could serve, so a static placement may serve less.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import linprog

from qlm.perf.profile import Profile
from qlm.sim.traces import Trace


@dataclass(frozen=True)
class LengthMoments:
    """The means of a length distribution that the cost of a request depends on."""

    prompt_tokens_mean: float
    output_tokens_mean: float
    output_x_prompt_mean: float  # E[O P]
    output_squared_mean: float  # E[O^2]

    @classmethod
    def of(cls, trace: Trace, max_output_tokens: int | None = None) -> LengthMoments:
        prompts = trace.prompt_tokens.astype(np.float64)
        outputs = trace.output_tokens.astype(np.float64)
        if max_output_tokens is not None:
            outputs = np.minimum(outputs, float(max_output_tokens))
        return cls(
            float(prompts.mean()),
            float(outputs.mean()),
            float((outputs * prompts).mean()),
            float((outputs * outputs).mean()),
        )

    @property
    def held_context_tokens(self) -> float:
        """Mean KV tokens a decoding request holds, weighted by how long it decodes."""
        return (self.output_x_prompt_mean + 0.5 * self.output_squared_mean) / max(
            self.output_tokens_mean, 1e-9
        )


def request_cost_s(profile: Profile, gpu_memory_bytes: int, lengths: LengthMoments) -> float:
    """Mean engine seconds one request of this length distribution takes on a saturated
    instance (module docstring)."""
    step = profile.step_time
    if step is None:  # a table-only profile: decode steps from the table, prefill at its rate
        batch = _batch_size(profile, gpu_memory_bytes, lengths)
        per_step_s = profile.decode_step_s_at(batch) / batch
        return lengths.prompt_tokens_mean / profile.prefill_tokens_per_s + (
            lengths.output_tokens_mean * per_step_s
        )
    batch = _batch_size(profile, gpu_memory_bytes, lengths)
    prefill_s = lengths.prompt_tokens_mean * (step.per_prefill_token_s + step.per_context_token_s)
    decode_s = lengths.output_tokens_mean * step.per_decode_seq_s + step.per_context_token_s * (
        lengths.output_x_prompt_mean + 0.5 * lengths.output_squared_mean
    )
    return prefill_s + decode_s + lengths.output_tokens_mean * step.base_s / batch


def _batch_size(profile: Profile, gpu_memory_bytes: int, lengths: LengthMoments) -> float:
    by_kv = profile.kv_capacity_tokens(gpu_memory_bytes) / max(lengths.held_context_tokens, 1.0)
    return max(1.0, min(float(profile.max_batch_size), by_kv))


def fleet_capacity_per_s(
    rates_per_s: Sequence[Mapping[str, float]], shares: Mapping[str, float]
) -> float:
    """The largest total request rate R such that R x shares[m] of each model can be served,
    where rates_per_s[i][m] is what instance i serves of model m per second when it runs only
    m (absent: it cannot run m) and each instance divides its time among its models.

    The linear program: maximise R over x[i][m] >= 0 with sum_m x[i][m] <= 1 for each
    instance and sum_i x[i][m] rates_per_s[i][m] >= R shares[m] for each model."""
    models = [m for m, share in shares.items() if share > 0]
    pairs = [(i, m) for i, rates in enumerate(rates_per_s) for m in models if m in rates]
    if any(not any(pm == m for _, pm in pairs) for m in models):
        return 0.0
    n = len(pairs) + 1  # the x[i][m], then R
    cost = np.zeros(n)
    cost[-1] = -1.0
    a_ub, b_ub = [], []
    for i in range(len(rates_per_s)):
        row = np.zeros(n)
        row[[k for k, (pi, _) in enumerate(pairs) if pi == i]] = 1.0
        a_ub.append(row)
        b_ub.append(1.0)
    for m in models:
        row = np.zeros(n)
        for k, (pi, pm) in enumerate(pairs):
            if pm == m:
                row[k] = -rates_per_s[pi][m]
        row[-1] = shares[m]
        a_ub.append(row)
        b_ub.append(0.0)
    result = linprog(cost, A_ub=np.array(a_ub), b_ub=np.array(b_ub), method="highs")
    if not result.success:
        raise RuntimeError(f"capacity LP failed: {result.message}")
    return float(result.x[-1])
