"""Miss causes from runs: small hand-built scenarios, driven by a scripted policy or fcfs, where
each cause is what the runner must have recorded (queue time split by where the model was,
interruptions), and the same facts on real policies stay consistent."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from qlm.agents.actions import Action, Evict, LoadModel, Pull
from qlm.sim.miss_causes import miss_cause
from qlm.sim.policies.policy_base import NO_ACTIONS, Actions, BasePolicy, SimContext
from qlm.sim.result import OutcomeState, RequestOutcome, SimResult
from qlm.sim.simulate import SimConfig, Simulation, default_engine_factory, simulate
from qlm.types import Fleet, Request
from tests.factories import make_instance, make_profile, make_request
from tests.sim.cases import CONFIG, mixed_requests, two_model_fleet


def fleet(*, prefill_tokens_per_s: float = 10_000.0, load_s: float = 30.0) -> Fleet:
    """One A100 with m7b loaded; m13b fits it too (a load takes load_s)."""
    profiles = [
        make_profile("m7b", load_s=load_s, prefill_tokens_per_s=prefill_tokens_per_s),
        make_profile("m13b", weight_gib=26.0, load_s=load_s),
    ]
    return Fleet.of([make_instance("i0", loaded_model="m7b")], profiles)


class _Script(BasePolicy):
    """Applies each (time, action) of its script at that virtual time, nothing else."""

    name = "script"

    def __init__(self, steps: Sequence[tuple[float, Action]]) -> None:
        super().__init__()
        self._steps = tuple(steps)

    def start(self, ctx: SimContext) -> Actions:
        super().start(ctx)
        for k, (at_s, _) in enumerate(self._steps):
            ctx.call_at(at_s, str(k))
        return NO_ACTIONS

    def on_timer(self, tag: str) -> Actions:
        return (self._steps[int(tag)][1],)


def scripted(
    fleet: Fleet, requests: Sequence[Request], steps: Sequence[tuple[float, Action]], **opts: float
) -> SimResult:
    sim = Simulation(
        fleet,
        requests,
        _Script(steps),
        CONFIG,
        0,
        options=SimConfig(**opts),
        progress=None,
        engine_factory=default_engine_factory,
    )
    return sim.run()


def only(result: SimResult) -> tuple[RequestOutcome, str | None]:
    (o,) = result.outcomes
    return o, miss_cause(o, result.end_s)


def request(**changes: object) -> Request:
    """Request r: interactive (TTFT 20 s), arriving at 0, 100 prompt and 50 output tokens."""
    fields: dict[str, object] = {"id": "r", "prompt_tokens": 100, "max_output_tokens": 50}
    return make_request(**{**fields, **changes})  # type: ignore[arg-type]


def test_held_in_the_queue_while_its_model_was_loaded_is_queued() -> None:
    o, cause = only(scripted(fleet(), [request()], [(30.0, Pull("i0", ("r",)))]))
    assert (o.queue_wait_s, o.no_model_wait_s, o.load_wait_s) == (30.0, 0.0, 0.0)
    assert cause == "queued"


@pytest.mark.parametrize(("load_at_s", "expected"), [(5.0, "model_load"), (40.0, "no_instance")])
def test_waiting_for_a_model_is_model_load_or_no_instance_by_the_larger_share(
    load_at_s: float, expected: str
) -> None:
    """i0 holds m7b; the m13b request waits while no instance has m13b, then while i0 loads
    it (30 s), and is pulled 1 s after the load."""
    steps = [(load_at_s, LoadModel("i0", "m13b")), (load_at_s + 31.0, Pull("i0", ("r",)))]
    o, cause = only(scripted(fleet(), [request(model="m13b")], steps))
    assert o.dispatch_s == load_at_s + 31.0
    assert o.no_model_wait_s == pytest.approx(load_at_s)
    assert o.load_wait_s == pytest.approx(30.0)
    assert o.queue_wait_s == pytest.approx(load_at_s + 31.0)
    assert cause == expected


def test_a_slow_prefill_is_in_engine() -> None:
    slow = fleet(prefill_tokens_per_s=10.0)  # 500 prompt tokens: 50 s
    result = simulate(slow, [request(prompt_tokens=500)], "fcfs", CONFIG, 0)
    o, cause = only(result)
    assert o.queue_wait_s == 0.0
    assert o.first_token_s is not None
    assert o.first_token_s > 40.0
    assert cause == "in_engine"


def test_evicted_before_the_first_token_is_evicted_after_a_late_one_is_not() -> None:
    slow = fleet(prefill_tokens_per_s=10.0)
    before = [
        (0.0, Pull("i0", ("r",))),
        (5.0, Evict("i0", ("r",), "test")),
        (6.0, Pull("i0", ("r",))),
    ]
    o, cause = only(scripted(slow, [request(prompt_tokens=500)], before))
    assert o.interrupted_s == 5.0
    assert o.evictions == 1
    assert o.queue_wait_s == pytest.approx(1.0)
    assert cause == "evicted"
    # First token at 30 s (late), evicted at 40 s while it decodes, back 1 s later.
    after = [
        (0.0, Pull("i0", ("r",))),
        (40.0, Evict("i0", ("r",), "test")),
        (41.0, Pull("i0", ("r",))),
    ]
    o, cause = only(scripted(slow, [request(prompt_tokens=300, max_output_tokens=2000)], after))
    assert o.interrupted_s == 40.0
    assert o.first_token_s is not None
    assert o.first_token_s < 40.0
    assert o.queue_wait_s == 0.0  # the wait after the first token is not counted
    assert cause == "in_engine"


def test_a_late_finish_after_an_on_time_first_token_is_slow_decode() -> None:
    late = request(max_output_tokens=1000, ttft_s=5.0, completion_s=10.0)  # ~20 s decoding
    o, cause = only(simulate(fleet(), [late], "fcfs", CONFIG, 0))
    assert o.first_token_s is not None
    assert o.first_token_s < o.ttft_deadline_s
    assert cause == "slow_decode"


def test_a_request_an_engine_keeps_dropping_failed() -> None:
    huge = request(prompt_tokens=100_000_000)  # beyond the KV cache: aborted at admission
    o, cause = only(simulate(fleet(), [huge], "fcfs", CONFIG, 0))
    assert o.state is OutcomeState.FAILED
    assert o.interrupted_s == 0.0
    assert cause == "failed"


def test_cut_before_its_deadline_is_unfinished_after_it_is_queued() -> None:
    o, cause = only(scripted(fleet(), [request()], [], max_time_s=10.0))
    assert o.state is OutcomeState.UNFINISHED
    assert cause == "unfinished"
    result = scripted(fleet(), [request()], [], max_time_s=30.0)
    o, cause = only(result)
    assert result.end_s >= o.ttft_deadline_s
    assert o.queue_wait_s == pytest.approx(result.end_s)
    assert cause == "queued"


def test_a_model_no_gpu_type_holds_is_no_instance() -> None:
    ghost = request(model="m70b")  # no profile for it at all
    result = simulate(fleet(), [ghost], "fcfs", CONFIG, 0, options=SimConfig(stall_s=30.0))
    o, cause = only(result)
    assert o.queue_wait_s == pytest.approx(result.end_s)
    assert o.no_model_wait_s == pytest.approx(result.end_s)
    assert cause == "no_instance"


@pytest.mark.parametrize("policy", ["fcfs", "edf", "llmd", "qlm-edf"])
def test_recorded_waits_are_consistent_on_real_policies(policy: str) -> None:
    requests = mixed_requests(300, 25.0, 11, models=("m13b", "m13b", "m13b", "m7b"))
    result = simulate(two_model_fleet(), requests, policy, CONFIG, 7)
    eps = 1e-6
    for o in result.outcomes:
        assert o.first_token_s is not None
        assert -eps <= o.no_model_wait_s
        assert -eps <= o.load_wait_s
        assert o.no_model_wait_s + o.load_wait_s <= o.queue_wait_s + eps
        assert o.queue_wait_s <= o.first_token_s - o.arrival_s + eps
        assert (miss_cause(o, result.end_s) is None) == o.met_slo
