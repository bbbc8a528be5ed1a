"""What sleeps where (qlm/agents/warming.py): a model's worth asleep on an instance is the
urgent arrivals a cold load of it would lose and a wake would not, shared among its hosts; an
instance fetches the worthiest model its tier lacks into a free place, one at a time."""

from __future__ import annotations

from dataclasses import replace

from qlm.agents.actions import FetchStandby
from qlm.agents.arrival_rates import ArrivalRates
from qlm.agents.warming import hosts_of, standby_fetch, standby_worths
from qlm.engine.types import EngineObservation, EngineState
from qlm.types import Fleet
from tests.factories import make_instance, make_profile


def _obs(
    model: str = "a",
    standby: tuple[str, ...] = (),
    fetching: tuple[str, ...] = (),
    capacity: int = 2,
    state: EngineState = EngineState.READY,
) -> EngineObservation:
    return EngineObservation(
        "i0", state, model, (), 0, 1_000, 8, standby_models=standby,
        fetching_models=fetching, standby_capacity=capacity,
    )  # fmt: skip


def test_the_worthiest_missing_model_fills_a_free_place() -> None:
    worths = {"a": 9.0, "b": 3.0, "c": 2.0, "d": 1.0}
    # a serves here; b and c are the worthiest of the rest
    assert standby_fetch(_obs(), worths) == FetchStandby("i0", "b")
    assert standby_fetch(_obs(standby=("b",)), worths) == FetchStandby("i0", "c")
    assert standby_fetch(_obs(standby=("c", "b")), worths) is None  # it has what it wants
    # full with d (served last): a fetch would drop it; the tier keeps what it served
    assert standby_fetch(_obs(standby=("d", "b")), worths) is None
    assert standby_fetch(_obs(fetching=("b",)), worths) is None  # one fetch at a time
    assert standby_fetch(_obs(state=EngineState.LOADING), worths) is None
    assert standby_fetch(_obs(capacity=0), worths) is None
    assert standby_fetch(_obs(), {}) is None


def test_a_model_few_instances_can_hold_is_worth_more_to_each() -> None:
    big = replace(make_profile("m70b", "A100", gpu_count=4, weight_gib=130.0, load_s=40.0),
                  wake_s=2.0)  # fmt: skip
    small = replace(make_profile("m7b", "A100", load_s=20.0), wake_s=1.0)
    cold = make_profile("m13b", "A100", load_s=20.0)  # no standby tier for it: no worth
    fleet = Fleet.of(
        [make_instance("a0", gpu_count=4), *(make_instance(f"s{i}") for i in range(3))],
        [big, small, cold],
    )
    hosts = hosts_of(fleet, ["m70b", "m7b", "m13b"])
    assert hosts == {"m70b": 1, "m7b": 4, "m13b": 4}
    rates = ArrivalRates(window_s=60.0)
    for t in range(60):
        rates.arrived("m7b", float(t), budget_s=5.0)  # 1 urgent per second
        rates.arrived("m13b", float(t), budget_s=5.0)
        if t % 4 == 0:
            rates.arrived("m70b", float(t), budget_s=5.0)  # 1 per 4 s
            rates.arrived("m7b", float(t), budget_s=600.0)  # can wait out any load
    worths = standby_worths(fleet, fleet.instance("a0"), rates, 60.0, hosts)
    # m70b: 0.25/s over its 40 s load, less over its 2 s wake (budget 5 s > 2 s: none), alone
    # on a0; m7b: 1/s over 20 s less nothing, shared by four instances
    assert worths == {"m70b": 10.0, "m7b": 5.0}
    assert standby_worths(fleet, fleet.instance("s1"), rates, 60.0, hosts) == {"m7b": 5.0}
