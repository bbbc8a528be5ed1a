"""What sleeps where (qlm/agents/warming.py): a model's worth asleep on an instance is the
urgent arrivals a cold load of it would lose and a wake would not, shared among its hosts; an
instance fetches the worthiest model its tier lacks into a free place, one at a time, its
worth shared with the instances that hold it already; a full tier gives a place held twice
in the fleet to a model held nowhere."""

from __future__ import annotations

from dataclasses import replace

from qlm.agents.actions import FetchStandby
from qlm.agents.arrival_rates import ArrivalRates
from qlm.agents.warming import copies_of, hosts_of, standby_fetch, standby_worths
from qlm.engine.engine_types import EngineObservation, EngineState
from qlm.types import Fleet
from tests.factories import make_instance, make_profile


def _obs(
    model: str | None = "a",
    standby: tuple[str, ...] = (),
    fetching: tuple[str, ...] = (),
    capacity: int = 2,
    state: EngineState = EngineState.READY,
    instance_id: str = "i0",
) -> EngineObservation:
    return EngineObservation(
        instance_id, state, model, (), 0, 1_000, 8, standby_models=standby,
        fetching_models=fetching, standby_capacity=capacity,
    )  # fmt: skip


def test_the_worthiest_missing_model_fills_a_free_place() -> None:
    worths = {"a": 9.0, "b": 3.0, "c": 2.0, "d": 1.0}

    def fetch(obs: EngineObservation) -> FetchStandby | None:
        return standby_fetch(obs, worths, copies_of([obs]))  # this instance alone

    # a serves here; b and c are the worthiest of the rest
    assert fetch(_obs()) == FetchStandby("i0", "b")
    assert fetch(_obs(standby=("b",))) == FetchStandby("i0", "c")
    assert fetch(_obs(standby=("c", "b"))) is None  # it has what it wants
    # full with d (served last): a fetch would drop it; the tier keeps what it served
    assert fetch(_obs(standby=("d", "b"))) is None
    assert fetch(_obs(fetching=("b",))) is None  # one fetch at a time
    assert fetch(_obs(state=EngineState.LOADING)) is None
    assert fetch(_obs(capacity=0)) is None
    assert standby_fetch(_obs(), {}, {}) is None


def test_a_model_held_elsewhere_is_worth_less_to_this_tier() -> None:
    worths = {"b": 3.0, "c": 2.0, "d": 1.0}
    here = _obs(capacity=1)
    other = _obs("b", standby=("c",), instance_id="i1")  # b serves there, c sleeps there
    copies = copies_of([here, other])
    assert copies == {"a": 1, "b": 1, "c": 1}
    # b's 3 shared with i1 (1.5), c's 2 with i1 (1.0), d's 1 alone: b still first
    assert standby_fetch(here, worths, copies) == FetchStandby("i0", "b")
    worths = {"b": 1.8, "c": 1.9, "d": 1.0}  # b 0.9, c 0.95, d 1.0: the fleet lacks d
    assert standby_fetch(here, worths, copies) == FetchStandby("i0", "d")


def test_a_full_tier_gives_a_place_held_twice_in_the_fleet_to_a_model_held_nowhere() -> None:
    worths = {"b": 3.0, "c": 2.0, "t": 0.5}
    here = _obs(standby=("b", "c"))
    other = _obs("b", instance_id="i1")  # b serves on i1 as well
    copies = copies_of([here, other])
    assert standby_fetch(here, worths, copies) == FetchStandby("i0", "t", replacing="b")
    # c is held only here, t nowhere: a place held once is not given up
    alone = copies_of([here, _obs("x", instance_id="i1")])
    assert standby_fetch(_obs(standby=("c",), capacity=1), worths, alone) is None
    # every worthy model is held somewhere: nothing to fetch
    assert standby_fetch(here, worths, copies | {"t": 1}) is None


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
