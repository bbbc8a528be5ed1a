"""The pieces of `qlm replay` (qlm/replay/): the prompts it sends, the plane it configures, how
it reads server times back into scenario seconds, and the comparison's arithmetic."""

from __future__ import annotations

import resource
from dataclasses import replace
from pathlib import Path

import pytest

from qlm.api.tokens import Utf8BytesCounter
from qlm.clock import VirtualClock
from qlm.config.engine_config import EngineConfig
from qlm.config.serve_config import LiveEngineConfig, ServeConfig
from qlm.engine.emulated import EmulatedEngine
from qlm.prefixes.prompt_blocks import prompt_prefix
from qlm.replay import sender
from qlm.replay.compare import comparison, comparison_table, prediction_error
from qlm.replay.embedded import STREAM_INTERVAL_S, embedded_config, scaled_profile
from qlm.replay.outcomes import live_result, outcome_of, swaps_by_instance
from qlm.replay.sender import Sent, body_of, prompt_of
from qlm.serve.runtime import ENGINE_KINDS
from qlm.sim.miss_causes import MissCause, miss_cause
from qlm.sim.result import OutcomeState
from qlm.sim.scenario import load_scenario
from qlm.types import PrefixBlock
from tests.factories import make_profile, make_request

SIMS = Path(__file__).resolve().parents[2] / "sims"


def test_a_prompt_counts_as_its_tokens_and_differs_from_every_other() -> None:
    counter = Utf8BytesCounter()
    a, b = make_request(prompt_tokens=777), make_request(prompt_tokens=777)
    assert counter.count(prompt_of(a)) == 777
    # no shared leading block: the API's prefix blocks of the two prompts differ from the first
    blocks_a = prompt_prefix(prompt_of(a), 777)
    blocks_b = prompt_prefix(prompt_of(b), 777)
    assert blocks_a
    assert blocks_a[0].key != blocks_b[0].key


def test_requests_with_a_shared_prefix_block_share_its_text() -> None:
    shared = (PrefixBlock(key=42, tokens=300),)
    a = replace(make_request(prompt_tokens=500), prefix=shared)
    b = replace(make_request(prompt_tokens=400), prefix=shared)
    text_a, text_b = prompt_of(a), prompt_of(b)
    assert text_a[: 4 * 300] == text_b[: 4 * 300]
    assert text_a[4 * 300 : 4 * 301] != text_b[4 * 300 : 4 * 301]
    assert Utf8BytesCounter().count(text_a) == 500


def test_the_body_carries_class_target_and_exact_length_at_the_speedup() -> None:
    request = make_request(prompt_tokens=10, max_output_tokens=33, ttft_s=60.0, completion_s=120.0)
    body = body_of(request, speedup=4.0)
    assert body["max_tokens"] == 33
    assert body["ignore_eos"] is True
    assert body["slo_ttft_s"] == pytest.approx(15.0)
    assert body["deadline_s"] == pytest.approx(30.0)


def test_the_embedded_plane_scales_profiles_targets_and_periods_alike() -> None:
    scenario = load_scenario(SIMS / "wb-quick.yaml")
    requests = scenario.requests(7)[:50]
    data = embedded_config(scenario, requests, speedup=4.0, port=8123)
    config = ServeConfig.model_validate(data)  # a valid fleet file
    classes = {c.name: c.ttft_s for c in config.qlm.slo_classes}
    assert classes["batch-1"] == pytest.approx(15.0)
    fleet, original = config.fleet(), scenario.fleet()
    for key, profile in original.profiles.items():
        fast = fleet.profiles[key]
        assert fast.load_s == pytest.approx(profile.load_s / 4)
        assert fast.prefill_tokens_per_s == pytest.approx(profile.prefill_tokens_per_s * 4)
        assert fast.decode_step_s[0] == pytest.approx(profile.decode_step_s[0] / 4)
    assert config.engine.speedup == 1.0  # the engines follow the scaled profiles as they are
    planner = config.qlm.planner  # the simulator's solver work, not a quarter of it
    assert planner.deterministic_work == pytest.approx(scenario.config.planner.time_limit_s)
    control, simulated = config.qlm.control, scenario.config.control
    assert control.tick_s == pytest.approx(simulated.tick_s / 4)
    # Seconds of prefill an engine may queue: a quarter of the wall time, the same prefill.
    assert simulated.prefill_backlog_s is not None
    assert control.prefill_backlog_s == pytest.approx(simulated.prefill_backlog_s / 4)


def test_the_embedded_engines_keep_the_scenarios_standby_tier() -> None:
    scenario = load_scenario(Path("many:0"))  # standby tier of 2 models per instance
    data = embedded_config(scenario, scenario.requests(0)[:5], speedup=2.0, port=8123)
    config = ServeConfig.model_validate(data)
    assert scenario.engine.standby_models == 2
    assert config.engine.standby_models == 2


def test_a_scenario_whose_engine_the_embedded_plane_cannot_run_is_refused() -> None:
    scenario = load_scenario(SIMS / "wb-quick.yaml")
    changed = scenario.model_copy(
        update={"engine": EngineConfig.model_validate({"max_num_seqs": 8})}
    )
    with pytest.raises(ValueError, match=r"engine\.max_num_seqs"):
        embedded_config(changed, changed.requests(0)[:5], speedup=2.0, port=8123)


def test_a_scaled_profile_keeps_everything_but_time() -> None:
    profile = make_profile(load_s=20.0)
    fast = scaled_profile(profile, 2.0)
    assert (fast.weight_bytes, fast.max_batch_size) == (
        profile.weight_bytes,
        profile.max_batch_size,
    )
    assert fast.load_s == 10.0
    assert fast.decode_step_s == tuple(s / 2 for s in profile.decode_step_s)


def test_server_times_come_back_as_scenario_seconds() -> None:
    request = make_request(arrival_at_s=100.0, ttft_s=60.0)
    times = {"arrival_at_s": 5000.0, "dispatched_at_s": 5001.0, "first_token_at_s": 5002.5,
             "finished_at_s": 5010.0}  # fmt: skip
    sent = Sent(request, "req-1", record={"state": "completed", "times": times, "evictions": 2})
    outcome = outcome_of(sent, speedup=4.0)
    assert outcome.dispatch_s == pytest.approx(104.0)
    assert outcome.first_token_s == pytest.approx(110.0)
    assert outcome.finish_s == pytest.approx(140.0)
    assert outcome.state is OutcomeState.COMPLETED
    assert outcome.met_slo
    assert outcome.evictions == 2
    late = outcome_of(Sent(request, "req-2", record={"state": "queued", "times": times}), 4.0)
    assert late.state is OutcomeState.UNFINISHED
    assert not late.met_slo
    refused = outcome_of(Sent(request, None, error="HTTP 429"), 4.0)
    assert refused.state is OutcomeState.UNFINISHED
    assert refused.first_token_s is None


def test_a_live_miss_is_put_down_to_where_its_time_went() -> None:
    """The live outcome carries the miss causes' facts (qlm/causes/live.py's rule): a request
    that waited in the queue past its deadline is `queued`, one dispatched twice `evicted`."""
    request = make_request(arrival_at_s=100.0, ttft_s=60.0)
    times = {"arrival_at_s": 5000.0, "dispatched_at_s": 5050.0, "first_token_at_s": 5051.0,
             "finished_at_s": 5060.0}  # fmt: skip
    record = {"state": "completed", "times": times, "dispatches": 1}
    waited = outcome_of(Sent(request, "req-1", record=record), speedup=4.0)
    assert waited.queue_wait_s == pytest.approx(200.0)
    assert miss_cause(waited, run_end_s=500.0) is MissCause.QUEUED
    again = outcome_of(Sent(request, "req-1", record={**record, "dispatches": 2}), speedup=4.0)
    assert miss_cause(again, run_end_s=500.0) is MissCause.EVICTED
    quick = {**times, "dispatched_at_s": 5000.5, "first_token_at_s": 5020.0}
    slow_engine = outcome_of(Sent(request, "r", record={**record, "times": quick}), speedup=4.0)
    assert miss_cause(slow_engine, run_end_s=500.0) is MissCause.IN_ENGINE


def test_swaps_are_read_from_the_plane_metrics() -> None:
    text = (
        "# TYPE qlm_model_swaps_total counter\n"
        'qlm_model_swaps_total{instance_id="a",model_name="m"} 2.0\n'
        'qlm_model_swaps_total{instance_id="a",model_name="n"} 1.0\n'
        'qlm_model_swaps_total{instance_id="b",model_name="m"} 1.0\n'
    )
    assert swaps_by_instance(text) == {"a": 3, "b": 1}


def test_the_comparison_counts_gaps_and_prediction_error() -> None:
    request = make_request(arrival_at_s=0.0, ttft_s=10.0, id="x")
    times = {"arrival_at_s": 0.0, "first_token_at_s": 2.0, "finished_at_s": 3.0}
    record = {"state": "completed", "times": times}
    met = Sent(request, "1", estimated_wait_s=1.0, estimate_basis="schedule", record=record)
    missed_times = {**times, "first_token_at_s": 20.0, "finished_at_s": 21.0}
    other = make_request(arrival_at_s=0.0, ttft_s=10.0, id="y")
    record = {"state": "completed", "times": missed_times}
    missed = Sent(other, "2", estimated_wait_s=4.0, estimate_basis="schedule", record=record)
    # The plan's fallback estimate is not the forecast the simulator grades: left out.
    third = make_request(arrival_at_s=0.0, ttft_s=10.0, id="z")
    planned = Sent(third, "3", estimated_wait_s=90.0, estimate_basis="plan", record=record)
    live = live_result([met, missed, planned], 1.0, 0, ["interactive"], {}, 1.0)
    simulated = live_result([met], 1.0, 0, ["interactive"], {"i": 2}, 1.0, policy="qlm")
    doc = comparison(live, simulated, {"interactive": 10.0})
    assert doc["gap_points"]["overall"] == pytest.approx(-200 / 3)
    assert doc["simulated"]["swaps"] == 2
    error = prediction_error(live, {"interactive": 10.0})["interactive"]
    assert error["requests"] == 2
    assert error["median_abs_error_of_target"] == pytest.approx((0.1 + 1.6) / 2)
    assert error["held"] == 0.0  # both came later than predicted
    # A `late` forecast predicts a miss, "past the target": right for the request that
    # missed (first token at 20 s), 8 s short of it for one that met it at 2 s.
    late = Sent(other, "2", estimated_wait_s=10.0, estimate_basis="late", record=record)
    met_record = {"state": "completed", "times": times}
    early = Sent(request, "1", estimated_wait_s=10.0, estimate_basis="late", record=met_record)
    graded = prediction_error(
        live_result([late, early], 1.0, 0, ["interactive"], {}, 1.0), {"interactive": 10.0}
    )["interactive"]
    assert graded["median_abs_error_of_target"] == pytest.approx((0.0 + 0.8) / 2)
    assert graded["late"] == 2
    assert graded["late_held"] == graded["held"] == 0.5
    assert error["late"] == 0
    assert error["late_held"] is None


def _lagging(request_id: str, slo_class: str, send_lag_s: float, admission_lag_s: float) -> Sent:
    """A request due at t=10 (monotonic) and wall 1000, sent and stamped late by these."""
    request = make_request(arrival_at_s=0.0, ttft_s=20.0, id=request_id, slo_class=slo_class)
    sent_at_s = 10.0 + send_lag_s
    times = {"arrival_at_s": 1000.0 + send_lag_s + admission_lag_s, "first_token_at_s": 1e4}
    return Sent(
        request,
        request_id,
        due_at_s=10.0,
        sent_at_s=sent_at_s,
        sent_wall_s=1000.0 + send_lag_s,
        record={"state": "completed", "times": times},
    )


def test_lags_from_the_scenario_time_to_the_plane_stamp_decide_faithfulness() -> None:
    targets = {"interactive": 20.0, "batch-1": 60.0}
    # At 2x: interactive 0.5 + 0.25 wall s late = 1.5 scenario s (within 10 % of 20 s);
    # batch-1 1 + 2 wall s = 6 scenario s (within 10 % of 60 s).
    sent = [_lagging("a", "interactive", 0.5, 0.25), _lagging("b", "batch-1", 1.0, 2.0)]
    live = live_result(sent, 2.0, 0, list(targets), {}, 1.0)
    assert live.policy_stats["send_lag_p99_s"] == pytest.approx(2.0)  # over every request
    assert live.policy_stats["admission_lag_p99_s"] == pytest.approx(4.0)
    doc = comparison(live, live, targets)
    assert doc["live"]["arrival_lag_p99_s"] == pytest.approx({"interactive": 1.5, "batch-1": 6.0})
    assert doc["replay"]["faithful"] is True
    assert "NOT FAITHFUL" not in comparison_table(doc)
    # An interactive request 1.5 wall s late at 2x: 3 s > 2 s of its 20 s target.
    sent.append(_lagging("c", "interactive", 1.0, 0.5))
    doc = comparison(live_result(sent, 2.0, 0, list(targets), {}, 1.0), live, targets)
    assert doc["replay"] == {"faithful": False, "late": ["interactive"], "lag_share": 0.1}
    assert "NOT FAITHFUL" in comparison_table(doc)
    # A request the client could not send at all makes the replay unfaithful as well.
    refused = Sent(make_request(id="d"), None, error="HTTP 429")
    doc = comparison(
        live_result([*sent[:2], refused], 2.0, 0, list(targets), {}, 1.0), live, targets
    )
    assert doc["replay"]["faithful"] is False


def test_the_embedded_engines_stream_in_coarse_chunks() -> None:
    scenario = load_scenario(SIMS / "wa-quick.yaml")
    data = embedded_config(scenario, scenario.requests(0)[:5], speedup=2.0, port=8123)
    config = ServeConfig.model_validate(data)
    assert (
        config.engine.stream_interval_s == STREAM_INTERVAL_S > LiveEngineConfig().stream_interval_s
    )
    fleet = config.fleet()
    instance = fleet.instances[0]
    engine = ENGINE_KINDS.create("emulated", config, instance, fleet, VirtualClock())
    assert isinstance(engine, EmulatedEngine)
    assert engine.stream_interval_s == STREAM_INTERVAL_S  # the setting reaches the engine


def test_the_replay_may_open_as_many_streams_as_the_system_allows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    set_to: list[tuple[int, int]] = []
    monkeypatch.setattr(resource, "setrlimit", lambda _, limits: set_to.append(limits))
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, 4096))
    sender.raise_open_files_limit()
    assert set_to == [(4096, 4096)]  # the soft limit up to the hard one
    unlimited = resource.RLIM_INFINITY
    monkeypatch.setattr(resource, "getrlimit", lambda _: (1024, unlimited))
    sender.raise_open_files_limit()
    assert set_to[-1] == (sender.OPEN_FILES_WANTED, unlimited)
    monkeypatch.setattr(resource, "getrlimit", lambda _: (4096, 4096))
    sender.raise_open_files_limit()
    assert len(set_to) == 2  # already at the hard limit: left alone
