"""`serverless` (qlm/sim/policies/serverless.py) on cases built to show its rules: a model
that waits gets an idle instance only past that instance's keep-alive (a cold load of its
model), a model used again within it stays, the least recently used instance goes, a
standby tier's wake wins over a cold load, and a backlog longer than one instance's slots
gets more instances."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qlm.config.engine_config import EngineConfig
from qlm.sim.result import OutcomeState, SimResult
from qlm.sim.simulate import SimulatedEngines, simulate
from qlm.types import Fleet, Instance, Request
from tests.factories import GIB, make_profile
from tests.sim.cases import CONFIG

LOAD_S = 10.0


def fleet(*instances: Instance, wake_s: float | None = None) -> Fleet:
    """One-slot engines (order of service shows) for m7b and m13b, cold loads of 10 s."""
    profiles = [
        replace(
            make_profile(m, max_batch_size=1, step_s=(0.01,), batch_sizes=(1,), load_s=LOAD_S),
            wake_s=wake_s,
        )
        for m in ("m7b", "m13b")
    ]
    return Fleet.of(list(instances), profiles)


def instance(id: str, model: str | None = "m7b", standby: tuple[str, ...] = ()) -> Instance:
    """An A100 instance; `standby`: models asleep in its tier at the start."""
    return Instance(id, "A100", 1, 80 * GIB, model, standby)


def req(id: str, at_s: float, model: str = "m7b", output: int = 100) -> Request:
    return Request(id, model, 100, output, "batch-2", at_s, at_s + 3600.0)


def first_token(result: SimResult, request_id: str) -> tuple[float, str | None]:
    o = next(o for o in result.outcomes if o.request_id == request_id)
    assert o.first_token_s is not None
    return o.first_token_s, o.instance_id


def ended(result: SimResult, request_id: str) -> float:
    o = next(o for o in result.outcomes if o.request_id == request_id)
    assert o.finish_s is not None
    return o.finish_s


def test_a_waiting_model_gets_the_idle_instance_only_past_its_keep_alive() -> None:
    requests = [req("r0", 0.0), req("b0", 1.0, model="m13b")]
    result = simulate(fleet(instance("i0")), requests, "serverless", CONFIG, 1)
    idle_s = ended(result, "r0")  # m7b idle from here: kept alive for one cold load
    at_s, where = first_token(result, "b0")
    assert where == "i0"
    assert at_s == pytest.approx(idle_s + LOAD_S + LOAD_S, abs=0.2)  # keep-alive, then load
    assert result.total_swaps == 1
    # edf swaps an idle instance at once
    edf = simulate(fleet(instance("i0")), requests, "edf", CONFIG, 1)
    assert first_token(edf, "b0")[0] < at_s - LOAD_S / 2


def test_a_model_used_again_within_its_keep_alive_stays() -> None:
    requests = [req("r0", 0.0), req("b0", 1.0, model="m13b"), req("r1", 6.0)]
    result = simulate(fleet(instance("i0")), requests, "serverless", CONFIG, 1)
    assert first_token(result, "r1")[0] == pytest.approx(6.0, abs=0.1)  # still warm
    # the keep-alive starts again when r1 ends
    assert first_token(result, "b0")[0] == pytest.approx(ended(result, "r1") + 2 * LOAD_S, abs=0.2)


def test_the_least_recently_used_instance_goes() -> None:
    # i0 takes the longer request (first in line), so i1 is idle longest: not fleet order
    requests = [req("r1", 0.0, output=500), req("r0", 0.0, output=100)]
    requests.append(req("b0", 30.0, model="m13b"))  # both idle past their keep-alive by then
    result = simulate(fleet(instance("i0"), instance("i1")), requests, "serverless", CONFIG, 1)
    longer = first_token(result, "r1")[1]
    at_s, where = first_token(result, "b0")
    assert longer == "i0"
    assert where == "i1"  # the instance idle longest loads it
    assert at_s == pytest.approx(30.0 + LOAD_S, abs=0.2)


def test_a_wake_from_the_standby_tier_wins_over_a_cold_load() -> None:
    requests = [req("r0", 0.0, output=100), req("r1", 0.0, output=500)]
    requests.append(req("b0", 30.0, model="m13b"))
    # i1 has m13b asleep in its standby tier, though it was used last (i0 is idle longest)
    instances = (instance("i0"), instance("i1", standby=("m13b",)))
    tiered = SimulatedEngines(EngineConfig(standby_models=1))
    result = simulate(
        fleet(*instances, wake_s=0.5), requests, "serverless", CONFIG, 1, engine_factory=tiered
    )
    at_s, where = first_token(result, "b0")
    assert first_token(result, "r1")[1] == "i1"
    assert where == "i1"
    assert at_s == pytest.approx(30.5, abs=0.2)


def test_a_backlog_longer_than_one_instances_slots_gets_more_instances() -> None:
    requests = [req(f"b{k}", 0.0, model="m13b") for k in range(4)]
    instances = (instance("i0", None), instance("i1", None), instance("i2", None))
    result = simulate(fleet(*instances), requests, "serverless", CONFIG, 1)
    assert result.total_swaps == 3  # one slot each: every empty instance loads m13b
    assert all(o.state is OutcomeState.COMPLETED for o in result.outcomes)
