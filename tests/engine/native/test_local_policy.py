"""Local scheduling in the native runner (qlm/engine/native/local_policy.py): srpt-mlfq against
fcfs on a mixed load (one long prompt among a stream of short ones), on a tiny random Llama
built in-process. Time is counted in engine steps."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import pytest

from qlm.engine.native.local_policy import LocalPolicyConfig, local_policy
from qlm.engine.native.paged_sequence import Sampling
from qlm.engine.native.runner_config import RunnerConfig
from qlm.engine.native.step_runner import NativeRunner
from tests.engine.native.helpers import random_checkpoint

LONG_PROMPT = 600
SHORT_PROMPT = 8
BUDGET = 32  # tokens a step
ARRIVAL_STEPS = 40
OUTPUT_TOKENS = 4


@dataclass(frozen=True)
class Outcome:
    ttft_steps: dict[str, int]  # first token's step minus arrival step
    tokens: dict[str, list[int]]


def run_mixed(policy: str, shorts_per_step: int, max_wait_steps: int = 64) -> Outcome:
    """A 600-token prompt at step 0 among `shorts_per_step` 8-token prompts arriving every
    step for 40 steps, all generating 4 tokens."""
    config = RunnerConfig(
        block_size=16,
        num_blocks=256,
        max_num_seqs=32,
        max_batched_tokens=BUDGET,
        policy=policy,
        max_wait_steps=max_wait_steps,
    )
    runner = NativeRunner(random_checkpoint(), config)
    sampling = Sampling(max_tokens=OUTPUT_TOKENS, temperature=0.0, ignore_eos=True)
    arrived: dict[str, int] = {}
    first: dict[str, int] = {}
    tokens: dict[str, list[int]] = {}
    runner.add("long", [i % 64 for i in range(LONG_PROMPT)], sampling)
    arrived["long"] = 0
    while runner.has_work or runner.steps < ARRIVAL_STEPS:
        if runner.steps < ARRIVAL_STEPS:
            for k in range(shorts_per_step):
                seq_id = f"s{runner.steps}-{k}"
                runner.add(
                    seq_id, [(runner.steps + k + j) % 64 for j in range(SHORT_PROMPT)], sampling
                )
                arrived[seq_id] = runner.steps
        result = runner.step()
        for emitted in result.emitted:
            first.setdefault(emitted.seq_id, runner.steps - arrived[emitted.seq_id])
            tokens.setdefault(emitted.seq_id, []).append(emitted.token)
    return Outcome(first, tokens)


def test_srpt_mlfq_serves_short_prompts_sooner_than_fcfs() -> None:
    """2 shorts a step take 22 of the 32 tokens: the long prompt still progresses."""
    fcfs, srpt = run_mixed("fcfs", 2), run_mixed("srpt-mlfq", 2)
    shorts = [seq for seq in fcfs.ttft_steps if seq != "long"]
    fcfs_mean = statistics.mean(fcfs.ttft_steps[s] for s in shorts)
    srpt_mean = statistics.mean(srpt.ttft_steps[s] for s in shorts)
    assert srpt_mean < fcfs_mean / 2, (srpt_mean, fcfs_mean)
    assert srpt.tokens == fcfs.tokens  # the order changes when, not what, each generates


def test_the_starvation_bound_gets_the_long_prompt_its_first_token_in_time() -> None:
    """3 shorts a step need more than the budget: without a bound the long prompt waits for
    the stream to end; with one it goes first after 10 steps, and its 600 tokens take at most
    30 more (the decodes leave at least 20 tokens a step)."""
    bounded = run_mixed("srpt-mlfq", 3, max_wait_steps=10)
    unbounded = run_mixed("srpt-mlfq", 3, max_wait_steps=10_000)
    decodes = 3 * OUTPUT_TOKENS
    assert bounded.ttft_steps["long"] <= 10 + -(-LONG_PROMPT // (BUDGET - decodes)) + 1
    assert unbounded.ttft_steps["long"] >= ARRIVAL_STEPS


def test_an_unknown_policy_is_refused_with_the_known_names() -> None:
    with pytest.raises(ValueError, match="fcfs, srpt-mlfq, prefix-groups"):
        local_policy("lifo", LocalPolicyConfig())


PREFIX = [(7 * i + 3) % 64 for i in range(96)]  # six full 16-token blocks


def admissions(policy: str, hots: int, max_wait_steps: int = 64) -> tuple[list[str], dict]:
    """One slot free beside a long request: "cold" (nothing cached) arrives, then `hots`
    requests whose first 96 of 98 tokens are cached. The order of their first tokens, and
    the tokens each generated."""
    config = RunnerConfig(
        num_blocks=256, max_num_seqs=2, policy=policy, max_wait_steps=max_wait_steps
    )
    runner = NativeRunner(random_checkpoint(), config)
    greedy = Sampling(max_tokens=2, temperature=0.0, ignore_eos=True)
    runner.add("system", [*PREFIX, 1], greedy)
    while runner.has_work:
        runner.step()
    runner.add("busy", [5, 6, 7], Sampling(max_tokens=400, temperature=0.0, ignore_eos=True))
    runner.step()
    runner.add("cold", [(11 * i + 5) % 64 for i in range(98)], greedy)
    for i in range(hots):
        runner.add(f"hot{i}", [*PREFIX, 10 + i, 20 + i], greedy)
    order: list[str] = []
    tokens: dict[str, list[int]] = {}
    while len(order) < hots + 1 or any(len(t) < 2 for t in tokens.values()):
        for emitted in runner.step().emitted:
            if emitted.seq_id not in tokens and emitted.seq_id != "busy":
                order.append(emitted.seq_id)
            if emitted.seq_id != "busy":
                tokens.setdefault(emitted.seq_id, []).append(emitted.token)
    return order, tokens


def test_prefix_groups_admit_cached_prompts_first_within_the_starvation_bound() -> None:
    """Preble's order: the hits (group 9 of 10) before the miss (group 0), which the
    starvation bound then brings forward; the tokens each generates do not change."""
    fcfs, fcfs_tokens = admissions("fcfs", hots=6)
    assert fcfs[0] == "cold"
    grouped, grouped_tokens = admissions("prefix-groups", hots=6)
    assert grouped[:6] == [f"hot{i}" for i in range(6)]
    assert grouped_tokens == fcfs_tokens
    bounded, _ = admissions("prefix-groups", hots=12, max_wait_steps=5)
    assert bounded.index("cold") < 8  # unbounded it would be last, after 12 hits
    unbounded, _ = admissions("prefix-groups", hots=12, max_wait_steps=10_000)
    assert unbounded[-1] == "cold"


def test_the_runner_tells_the_policy_what_the_cache_holds_without_taking_it() -> None:
    runner = NativeRunner(random_checkpoint(), RunnerConfig(num_blocks=64))
    greedy = Sampling(max_tokens=1, temperature=0.0, ignore_eos=True)
    runner.add("system", [*PREFIX, 1], greedy)
    while runner.has_work:
        runner.step()
    runner.add("hot", [*PREFIX, 2, 3], greedy)
    runner.add("half", [*PREFIX[:40], 9, 9, 9], greedy)
    free = runner.pool.free_blocks
    assert runner.cached(runner.seq("hot")) == 96
    assert runner.cached(runner.seq("half")) == 32  # two full blocks of 16
    assert runner.pool.free_blocks == free  # nothing held
