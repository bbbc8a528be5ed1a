"""`logos` (qlm/sim/policies/logos.py) on cases built to show its rules: a model nobody
serves gets an idle instance once its keep-alive ends; otherwise a switch is taken only when
the wait it saves reaches its tier's ratio (a wake 1.5x, a cold load 2x, a drain and load
3x), a popular model's last instance is not given away for a tail request, a busy instance
drains before it switches, and no switch strands its own model's queued work."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qlm.config.engine_config import EngineConfig
from qlm.sim.result import OutcomeState, SimResult
from qlm.sim.simulate import SimulatedEngines, simulate
from qlm.types import Fleet, Instance, Request
from tests.factories import GIB, make_profile
from tests.sim.cases import CONFIG

LOAD_S, WAKE_S = 10.0, 0.5
TIERED = SimulatedEngines(EngineConfig(standby_models=1))


def fleet(*instances: Instance) -> Fleet:
    """One-slot engines; a request of 100 output tokens takes about 1 s."""
    profiles = [
        replace(
            make_profile(m, max_batch_size=1, step_s=(0.01,), batch_sizes=(1,), load_s=LOAD_S),
            wake_s=WAKE_S,
        )
        for m in ("m7b", "m13b")
    ]
    return Fleet.of(list(instances), profiles)


def instance(id: str, model: str | None, standby: tuple[str, ...] = ()) -> Instance:
    return Instance(id, "A100", 1, 80 * GIB, model, standby)


def req(id: str, at_s: float, model: str = "m13b", output: int = 100) -> Request:
    return Request(id, model, 100, output, "batch-2", at_s, at_s + 3600.0)


def served_by(result: SimResult, instance_id: str, model: str) -> list[float]:
    """First-token times of `model`'s requests on the instance."""
    return sorted(
        o.first_token_s
        for o in result.outcomes
        if o.instance_id == instance_id and o.model == model and o.first_token_s is not None
    )


def first_token(result: SimResult, request_id: str) -> float:
    o = next(o for o in result.outcomes if o.request_id == request_id)
    assert o.first_token_s is not None
    return o.first_token_s


def run(instances: tuple[Instance, ...], requests: list[Request]) -> SimResult:
    return simulate(fleet(*instances), requests, "logos", CONFIG, 1, engine_factory=TIERED)


def test_a_model_nobody_serves_gets_an_idle_instance_once_its_keep_alive_ends() -> None:
    # i0 keeps m7b one cold load (10 s) from the start of the run (the first arrival, 1 s),
    # then loads m13b (10 s)
    result = run((instance("i0", "m7b"),), [req("b0", 1.0)])
    assert served_by(result, "i0", "m13b") == [pytest.approx(1.0 + 2 * LOAD_S, abs=0.1)]
    # an instance with no model takes it at once
    empty = run((instance("i0", None),), [req("b0", 1.0)])
    assert served_by(empty, "i0", "m13b") == [pytest.approx(1.0 + LOAD_S, abs=0.1)]


def test_a_cold_load_needs_twice_its_time_saved_a_wake_one_and_a_half() -> None:
    # Three m13b requests of about 1 s on one one-slot instance: 2 s of queue behind the
    # first. Another instance joining after a cold load (10 s) saves nothing: no switch.
    # One m7b request at the start; by 15 s i1's keep-alive of m7b (10 s) is over.
    requests = [req("m", 0.0, model="m7b", output=10)] + [req(f"b{k}", 15.0) for k in range(3)]
    cold = run((instance("i0", "m13b"), instance("i1", "m7b")), requests)
    assert cold.total_swaps == 0
    assert served_by(cold, "i1", "m13b") == []
    # ... with m13b asleep in i1's standby tier, a wake (0.5 s) ends the queue 0.75 s sooner
    # for 2 requests: 1.5 request-seconds, over 1.5 x 0.5, so i1 wakes it and shares the queue.
    warm = run((instance("i0", "m13b"), instance("i1", "m7b", standby=("m13b",))), requests)
    assert warm.total_swaps == 1
    shared = served_by(warm, "i1", "m13b")
    assert shared[0] == pytest.approx(15.0 + WAKE_S, abs=0.1)


def test_a_popular_models_last_instance_is_not_given_away_for_a_tail_request() -> None:
    # m7b's only instance idles between arrivals (2 a second, each done in about 0.1 s);
    # one interactive m13b request (20 s left) gains at most 20 request-seconds, against a
    # 10 s load times the ~40 m7b arrivals it would strand (away 20 s).
    requests = [req(f"p{k}", 0.5 * k, model="m7b", output=10) for k in range(120)]
    requests.append(replace(req("tail", 30.0), slo_class="interactive", ttft_deadline_at_s=50.0))
    result = run((instance("i0", "m7b"),), requests)
    assert all(o.met_slo for o in result.outcomes if o.model == "m7b")
    # it is served once m7b's last minute of arrivals (up to 59.5 s) no longer outnumbers it
    assert first_token(result, "tail") > 59.5 + LOAD_S
    assert result.total_swaps == 1
    # ... while nobody's model, idle, takes it at once
    spare = run((instance("i0", "m7b"), instance("i1", None)), requests)
    assert served_by(spare, "i1", "m13b") == [pytest.approx(30.0 + LOAD_S, abs=0.1)]


def test_a_busy_instance_drains_before_it_switches_when_the_saving_is_three_times() -> None:
    # i1 decodes a 20 s m7b request; 400 s of m13b queue on i0. Draining (20 s) and loading
    # (10 s) saves about (400 - 30) / 2 s: over 3 x 30 s. The m7b request is not evicted.
    requests = [req("long", 0.0, model="m7b", output=2000)]
    requests += [req(f"b{k}", 0.1) for k in range(400)]
    result = run((instance("i0", "m13b"), instance("i1", "m7b")), requests)
    assert result.evictions == 0
    long = next(o for o in result.outcomes if o.request_id == "long")
    assert long.state is OutcomeState.COMPLETED
    assert long.finish_s is not None
    first = served_by(result, "i1", "m13b")[0]
    assert first == pytest.approx(long.finish_s + LOAD_S, abs=0.2)


def test_no_switch_strands_the_instances_own_queued_work() -> None:
    # As above, but more m7b requests wait behind the long one: i1 never leaves m7b.
    requests = [req("long", 0.0, model="m7b", output=2000)]
    requests += [req(f"m{k}", 0.0, model="m7b") for k in range(5)]
    requests += [req(f"b{k}", 0.1) for k in range(400)]
    result = run((instance("i0", "m13b"), instance("i1", "m7b")), requests)
    first_m13b = served_by(result, "i1", "m13b")
    last_m7b = max(served_by(result, "i1", "m7b"))
    assert not first_m13b or first_m13b[0] > last_m7b


def test_a_drain_is_called_off_when_its_model_arrives_again() -> None:
    # As in the drain case, but an m7b request arrives at 12 s, while i1 drains (its long
    # request ends at about 20 s): i1 stays on m7b and serves it next, not after a load.
    requests = [req("long", 0.0, model="m7b", output=2000), req("again", 12.0, model="m7b")]
    requests += [req(f"b{k}", 0.1) for k in range(400)]
    result = run((instance("i0", "m13b"), instance("i1", "m7b")), requests)
    long = next(o for o in result.outcomes if o.request_id == "long")
    assert long.finish_s is not None
    assert first_token(result, "again") == pytest.approx(long.finish_s, abs=0.2)


def test_only_an_instance_that_can_hold_the_model_is_switched() -> None:
    # i1 has too little memory for m13b (its weights alone are 60 GiB here): i0, busy with
    # m7b's backlog, is the only one that could, and it never strands m7b's queue.
    big = make_profile("m13b", max_batch_size=1, step_s=(0.01,), batch_sizes=(1,), weight_gib=60.0)
    small = make_profile("m7b", max_batch_size=1, step_s=(0.01,), batch_sizes=(1,))
    fleet_ = Fleet.of(
        [instance("i0", "m7b"), Instance("i1", "A100", 1, 40 * GIB, "m7b")], [small, big]
    )
    requests = [req("b0", 0.0)] + [req(f"m{k}", 0.0, model="m7b") for k in range(3)]
    for policy in ("logos", "serverless"):
        result = simulate(fleet_, requests, policy, CONFIG, 1, engine_factory=TIERED)
        assert {ld.instance_id for ld in result.loads} <= {"i0"}, policy
