"""EngineModel: hand-computed times, batching limits, chunked prefill, preemption, loading,
aborts, fast-forwarded decode runs against a step-by-step reference, and conservation.

Unless a case says otherwise the step model is tests/engine/helpers.STEP:
t = 10 ms + 0.1 ms x prefill tokens + 1 ms x decoding sequences + 1 us x context tokens.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from qlm.config.engine_config import EngineConfig
from qlm.engine.engine_types import (
    Aborted,
    EngineError,
    EngineEvent,
    EngineState,
    FirstToken,
    ModelLoaded,
    RequestFinished,
)
from qlm.engine.model.core import EngineModel
from qlm.perf.step import StepTime
from tests.engine.helpers import (
    OPERATIONS,
    STEP,
    aborted,
    apply_operation,
    conservation_engine,
    engine,
    exact_instance,
    exact_profile,
    finishes,
    first_tokens,
    req,
    run_all,
)
from tests.engine.reference import RefRequest, run_reference

# ---------------------------------------------------------------- hand computations


def test_single_request_times_match_a_hand_computation() -> None:
    model = engine()
    model.add(req("a", prompt=100, output=3), 0.0)
    events = run_all(model)
    # prefill: 10 ms + 100 x 0.1 ms + 100 x 1 us = 20.1 ms -> first token
    assert first_tokens(events)["a"] == pytest.approx(0.0201)
    # two decode steps at 101 and 102 tokens of context: 11.101 ms and 11.102 ms
    done = finishes(events)["a"]
    assert done.at_s == pytest.approx(0.0201 + 0.011101 + 0.011102)
    assert done.output_tokens == 3
    assert done.first_token_at_s == pytest.approx(0.0201)
    assert done.finish_reason == "length"


def test_two_requests_batch_together_then_one_runs_alone() -> None:
    model = engine()
    model.add(req("a", prompt=100, output=2), 0.0)
    model.add(req("b", prompt=200, output=4), 0.0)
    events = run_all(model)
    # one iteration prefills both: 10 + 300 x 0.1 + 300 x 0.001 ms = 40.3 ms
    assert first_tokens(events) == pytest.approx({"a": 0.0403, "b": 0.0403})
    # a decode step of both (context 101 + 201): 10 + 2 + 0.302 = 12.302 ms -> a ends
    assert finishes(events)["a"].at_s == pytest.approx(0.052602)
    # b alone at contexts 202 and 203: 11.202 and 11.203 ms
    assert finishes(events)["b"].at_s == pytest.approx(0.052602 + 0.011202 + 0.011203)


def test_chunked_prefill_splits_a_long_prompt_over_iterations() -> None:
    model = engine(config=EngineConfig(chunk_tokens=512))
    model.add(req("a", prompt=1300, output=1), 0.0)
    events = run_all(model)
    # chunks 512, 512, 276 with context 512, 1024, 1300 after each
    expected = (0.01 + 0.0512 + 0.000512) + (0.01 + 0.0512 + 0.001024) + (0.01 + 0.0276 + 0.0013)
    assert first_tokens(events)["a"] == pytest.approx(expected)
    assert model.stats.iterations == 3
    assert model.stats.prefill_tokens == 1300


def test_decodes_take_their_share_of_the_token_budget_first() -> None:
    model = engine(config=EngineConfig(chunk_tokens=512))
    model.add(req("a", prompt=10, output=100), 0.0)
    model.add(req("b", prompt=1000, output=1), 0.0)
    events = run_all(model)
    # iteration 1: a's 10 tokens + b's first 502; iteration 2: a decodes (1 token of the
    # budget) and b's remaining 498 fit in the other 511.
    iter1 = 0.01 + 512 * 1e-4 + 512 * 1e-6
    iter2 = 0.01 + 498 * 1e-4 + 1e-3 + (11 + 1000) * 1e-6
    assert first_tokens(events)["a"] == pytest.approx(iter1)
    assert first_tokens(events)["b"] == pytest.approx(iter1 + iter2)


def test_continuous_batching_admits_up_to_max_num_seqs() -> None:
    model = engine(config=EngineConfig(max_num_seqs=4))
    for i in range(10):
        model.add(req(f"r{i}", prompt=10, output=5), 0.0)
    events = run_all(model)
    starts = Counter(first_tokens(events).values())
    # FCFS waves of four: four start together, then the next four, then the last two.
    assert [starts[t] for t in sorted(starts)] == [4, 4, 2]
    assert len(finishes(events)) == 10


def test_waiting_head_blocks_the_queue_fcfs() -> None:
    # Room for a's KV and c's, not b's: b blocks c until a finishes (strict FCFS).
    model = engine(capacity_tokens=300)
    model.add(req("a", prompt=150, output=5), 0.0)
    model.add(req("b", prompt=200, output=5), 0.0)
    model.add(req("c", prompt=10, output=5), 0.0)
    events = run_all(model)
    ft = first_tokens(events)
    assert ft["a"] < ft["b"] <= ft["c"]
    assert ft["b"] > finishes(events)["a"].at_s - 1e-12


# ---------------------------------------------------------------- preemption


def _kv_squeeze(config: EngineConfig | None = None) -> tuple[EngineModel, list[EngineEvent]]:
    """Two requests that fit at admission (101 + 101 <= 300) but not once both decode."""
    model = engine(capacity_tokens=300, config=config)
    model.add(req("a", prompt=100, output=150), 0.0)
    model.add(req("b", prompt=100, output=150), 0.0)
    return model, run_all(model)


def test_kv_exhaustion_preempts_the_latest_by_recompute() -> None:
    model, events = _kv_squeeze()
    assert model.stats.preemptions_recompute >= 1
    assert model.stats.preemptions_swap == 0
    done = finishes(events)
    assert done["a"].output_tokens == done["b"].output_tokens == 150
    assert done["a"].at_s < done["b"].at_s  # b, admitted last, was the victim
    assert [e.request_id for e in events if isinstance(e, FirstToken)] == ["a", "b"]
    # The recompute prefilled b's prompt and its generated tokens again.
    assert model.stats.prefill_tokens > 200


def test_kv_exhaustion_swaps_to_cpu_in_swap_mode() -> None:
    config = EngineConfig(preemption_mode="swap", cpu_swap_tokens=1000)
    model = engine(capacity_tokens=300, config=config)
    model.add(req("a", prompt=100, output=150), 0.0)
    model.add(req("b", prompt=100, output=150), 0.0)
    seen_on_cpu = False
    t = 0.0
    while (at := model.next_event_at_s()) is not None:
        t = at
        model.advance_to(t)
        seen_on_cpu |= any(r.kv_on_cpu for r in model.observe(t).requests)
    assert seen_on_cpu
    assert model.stats.preemptions_swap >= 1
    assert model.stats.preemptions_recompute == 0
    assert model.stats.swapped_tokens > 0
    assert model.stats.prefill_tokens == 200  # nothing recomputed
    _, recompute_events = _kv_squeeze()
    assert model.stats.finished == 2
    assert t < finishes(recompute_events)["b"].at_s  # swapping beats recomputing here


def test_swap_mode_needs_cpu_space() -> None:
    with pytest.raises(ValueError, match="cpu_swap_tokens"):
        EngineConfig(preemption_mode="swap")


# ---------------------------------------------------------------- operations


def test_load_serves_nothing_for_load_s_then_reports_model_loaded() -> None:
    model = engine(profiles=[exact_profile("m", load_s=5.0), exact_profile("m2", load_s=7.0)])
    model.add(req("a", output=100_000), 0.0)
    model.load("m2", 1.0)
    assert aborted(model.advance_to(1.0))["a"].at_s == 1.0
    assert model.state is EngineState.LOADING
    assert model.next_event_at_s() == pytest.approx(8.0)
    model.add(req("b", prompt=100, output=1, model="m2"), 2.0)
    with pytest.raises(EngineError, match="serves 'm2'"):
        model.add(req("c", model="m"), 2.0)
    obs = model.observe(3.0)
    assert (obs.state, obs.model, len(obs.requests)) == (EngineState.LOADING, "m2", 1)
    assert model.advance_to(7.999) == []
    events = model.advance_to(9.0)
    assert events[0] == ModelLoaded("m2", 8.0, 7.0)
    assert first_tokens(events)["b"] == pytest.approx(8.0 + 0.0201)


def test_an_empty_engine_takes_no_requests_until_loaded() -> None:
    model = engine(loaded_model=None)
    assert model.state is EngineState.EMPTY
    with pytest.raises(EngineError, match="no model"):
        model.add(req("a"), 0.0)
    model.load("m", 0.0)
    assert model.advance_to(5.0) == [ModelLoaded("m", 5.0, 5.0)]
    assert model.state is EngineState.READY


def test_load_of_an_unknown_or_unfitting_model_is_refused() -> None:
    too_big = replace(exact_profile("big"), weight_bytes=1000)  # weights beyond the memory
    other_gpu = exact_profile("other", gpu_type="X")
    model = EngineModel(exact_instance(100), [exact_profile(), other_gpu, too_big])
    assert model.models() == ("m",)
    for name in ("other", "big"):
        with pytest.raises(EngineError, match=f"cannot load '{name}'"):
            model.load(name, 0.0)


def test_abort_frees_kv_at_once() -> None:
    model = engine()
    model.add(req("a", prompt=100, output=1000), 0.0)
    model.add(req("b", prompt=50, output=1000), 0.0)
    assert model.observe(0.5).kv_used_tokens > 150
    model.abort(["a", "unknown"], 0.5)
    events = model.advance_to(0.5)
    assert aborted(events) == {"a": Aborted("a", 0.5, "aborted")}
    obs = model.observe(0.5)
    assert [r.request_id for r in obs.requests] == ["b"]
    b = obs.requests[0]
    assert obs.kv_used_tokens == b.prompt_tokens + b.output_tokens
    model.abort(["b"], 0.6)
    assert model.observe(0.6).kv_used_tokens == 0
    assert model.next_event_at_s() is None


def test_explicit_swap_out_pauses_and_swap_in_resumes() -> None:
    model = engine(config=EngineConfig(cpu_swap_tokens=10_000))
    model.add(req("a", prompt=100, output=200), 0.0)
    model.swap_out(["a"], 0.5)
    obs = model.observe(0.5)
    held = obs.requests[0]
    assert held.kv_on_cpu
    assert obs.kv_used_tokens == 0
    assert model.next_event_at_s() is None  # paused: nothing runs
    model.swap_in(["a"], 10.0)
    events = model.advance_to(100.0)
    done = finishes(events)["a"]
    assert done.output_tokens == 200
    assert done.at_s > 10.0
    assert model.stats.prefill_tokens == 100  # resumed without recomputing


def test_swap_operations_fail_without_swap_space() -> None:
    model = engine()
    model.add(req("a"), 0.0)
    with pytest.raises(EngineError, match="swapping is off"):
        model.swap_out(["a"], 0.1)
    small = engine(config=EngineConfig(cpu_swap_tokens=10))
    small.add(req("a", prompt=100), 0.0)
    with pytest.raises(EngineError, match="do not fit"):
        small.swap_out(["a"], 0.1)


def test_refusals_name_the_problem() -> None:
    model = engine()
    model.add(req("a"), 0.0)
    with pytest.raises(EngineError, match="already admitted"):
        model.add(req("a"), 0.0)
    with pytest.raises(EngineError, match="wants 'x'"):
        model.add(req("z", model="x"), 0.0)
    model.advance_to(1.0)
    with pytest.raises(ValueError, match="time went back"):
        model.advance_to(0.5)


def test_prompt_larger_than_the_cache_is_aborted_and_outputs_are_capped_by_it() -> None:
    model = engine(capacity_tokens=150)
    model.add(req("huge", prompt=150), 0.0)  # needs 151 with its first token
    model.add(req("long", prompt=100, output=80), 0.0)  # only 50 tokens of room to grow
    events = run_all(model)
    assert "huge" in aborted(events)
    assert finishes(events)["long"].output_tokens == 50
    assert finishes(events)["long"].finish_reason == "length"


def test_an_own_output_length_below_the_cap_stops() -> None:
    model = engine()
    model.add(req("a", output=100), 0.0, output_tokens=7)
    done = finishes(run_all(model))["a"]
    assert (done.output_tokens, done.finish_reason) == (7, "stop")


# ---------------------------------------------------------------- fast-forwarding


def test_a_decode_run_is_one_segment() -> None:
    model = engine()
    model.add(req("a", prompt=100, output=10_000), 0.0)
    first = model.next_event_at_s()
    assert first is not None
    model.advance_to(first)
    end = model.next_event_at_s()  # the whole decode run, in one step of the model
    assert end is not None
    steps = [STEP.decode_step_s(1, 100 + k) for k in range(1, 10_000)]
    assert end - first == pytest.approx(math.fsum(steps), rel=1e-9)
    assert [type(e) for e in model.advance_to(end)] == [RequestFinished]
    assert model.stats.iterations == 10_000
    assert model.stats.segments == 2  # the prefill, then 9,999 decode steps in one go


def test_observe_counts_the_decode_steps_done_inside_a_run() -> None:
    model = engine()
    model.add(req("a", prompt=100, output=1000), 0.0)
    ends = [0.0201]
    for k in range(1, 1000):
        ends.append(ends[-1] + STEP.decode_step_s(1, 100 + k))
    for t in (0.0, 0.02, 0.0202, 0.5, ends[500] - 1e-6, ends[500] + 1e-6, 9.0):
        expected = sum(1 for e in ends if e <= t)
        obs = model.observe(t)
        assert obs.requests[0].output_tokens == expected, t
        if expected:
            assert obs.kv_used_tokens == 100 + expected


def test_an_arrival_mid_run_joins_after_the_step_in_flight() -> None:
    model = engine()
    model.add(req("a", prompt=100, output=1000), 0.0)
    ends = [0.0201]
    for k in range(1, 1000):
        ends.append(ends[-1] + STEP.decode_step_s(1, 100 + k))
    arrive = (ends[300] + ends[301]) / 2
    model.add(req("b", prompt=50, output=1), arrive)
    # b is prefilled in the iteration after a's step 301, together with a's decode.
    a_context = 100 + 302
    mixed = 0.01 + 50 * 1e-4 + 1e-3 + (a_context + 50) * 1e-6
    assert first_tokens(run_all(model))["b"] == pytest.approx(ends[301] + mixed)


step_models = st.one_of(
    st.none(),
    st.builds(
        StepTime,
        base_s=st.floats(1e-3, 0.05),
        per_prefill_token_s=st.floats(1e-5, 1e-3),
        per_decode_seq_s=st.floats(0.0, 1e-3),
        per_context_token_s=st.floats(0.0, 1e-5),
    ),
)
request_specs = st.lists(
    st.tuples(
        # gap to the previous arrival: simultaneous, or clear of the 1 ns tolerance within
        # which an arrival counts as at an iteration boundary
        st.one_of(st.just(0.0), st.floats(1e-6, 0.5)),
        st.integers(1, 600),  # prompt tokens
        st.integers(1, 120),  # output tokens
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    step=step_models,
    specs=request_specs,
    capacity=st.integers(200, 4000),
    max_num_seqs=st.integers(1, 16),
    chunk_tokens=st.integers(16, 1024),
)
def test_fast_forward_matches_a_step_by_step_reference(
    step: StepTime | None,
    specs: list[tuple[float, int, int]],
    capacity: int,
    max_num_seqs: int,
    chunk_tokens: int,
) -> None:
    profile = exact_profile(step_time=step, max_batch_size=max_num_seqs)
    model = EngineModel(
        exact_instance(capacity), [profile], EngineConfig(chunk_tokens=chunk_tokens)
    )
    refs: list[RefRequest] = []
    events: list[EngineEvent] = []
    t = 0.0
    for i, (gap, prompt, output) in enumerate(specs):
        t += gap
        events += model.advance_to(t)
        model.add(req(f"r{i}", prompt=prompt, output=output, at_s=t), t)
        refs.append(RefRequest(f"r{i}", t, prompt, output))
    events += model.advance_to(1e9)
    ref = run_reference(profile, capacity, min(max_num_seqs, chunk_tokens), chunk_tokens, refs)
    assert set(aborted(events)) == ref.aborted
    assert first_tokens(events) == pytest.approx(ref.first_token_s, rel=1e-9, abs=1e-9)
    done = finishes(events)
    assert {k: f.at_s for k, f in done.items()} == pytest.approx(ref.finish_s, rel=1e-9, abs=1e-9)
    assert {k: f.output_tokens for k, f in done.items()} == ref.output_tokens
    assert model.stats.preemptions_recompute == ref.preemptions
    assert model.stats.iterations == ref.iterations


# ---------------------------------------------------------------- conservation

operations = st.lists(
    st.tuples(
        st.sampled_from(OPERATIONS),
        st.floats(0.0, 0.3),  # time since the previous operation
        st.integers(0, 30),  # which request
        st.integers(1, 400),  # prompt tokens
        st.integers(1, 200),  # output tokens
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=operations,
    mode=st.sampled_from(["recompute", "swap"]),
    order=st.sampled_from(["fcfs", "srpt-mlfq"]),
)
def test_every_request_ends_exactly_once(
    ops: list[tuple[str, float, int, int, int]], mode: str, order: str
) -> None:
    model = conservation_engine(mode, order)
    events: list[EngineEvent] = []
    added: set[str] = set()
    t = 0.0
    for op, gap, k, prompt, output in ops:
        t += gap
        events += model.advance_to(t)
        apply_operation(model, op, req(f"r{k}", prompt=prompt, output=output), t, added)
        obs = model.observe(t)
        assert 0 <= obs.kv_used_tokens <= obs.kv_capacity_tokens
        assert {r.request_id for r in obs.requests} <= added
    # Release everything still paused, then run to the end.
    model.swap_in([f"r{k}" for k in range(31)], t)
    events += model.advance_to(t + 1e6)
    ends = Counter(e.request_id for e in events if isinstance(e, RequestFinished | Aborted))
    assert set(ends) == added
    assert all(n == 1 for n in ends.values())
    times = [e.at_s for e in events]
    assert times == sorted(times)
    for e in events:
        if isinstance(e, RequestFinished):
            assert e.first_token_at_s <= e.at_s
            assert e.output_tokens >= 1
    assert model.observe(t + 1e6).requests == ()
