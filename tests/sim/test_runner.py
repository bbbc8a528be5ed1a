"""The runner: conservation, determinism, bounded metrics, model loads, stopping rules."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from qlm.agents.actions import Pull
from qlm.engine.engine_types import EngineEvent
from qlm.registry import UnknownPolicyError
from qlm.sim.policies import SIM_POLICIES
from qlm.sim.policies.policy_base import NO_ACTIONS, Actions, BasePolicy
from qlm.sim.result import OutcomeState, SimResult
from qlm.sim.simulate import (
    SimConfig,
    SimulatedEngines,
    Simulation,
    SimulationError,
    default_engine_factory,
    simulate,
)
from qlm.types import Request
from tests.sim.cases import CONFIG, mixed_requests, two_model_fleet

MILP_POLICIES = ("qlm", "qlm-no-evict", "qlm-no-swap")  # the MILP stops on a wall-clock limit
FAST_POLICIES = tuple(p for p in SIM_POLICIES.names() if p not in MILP_POLICIES)


def run(policy: str, count: int = 300, rate_per_s: float = 20.0, seed: int = 3) -> SimResult:
    return simulate(two_model_fleet(), mixed_requests(count, rate_per_s, seed), policy, CONFIG, 7)


def check_conservation(result: SimResult, requests: Sequence[Request]) -> None:
    ids = [o.request_id for o in result.outcomes]
    assert ids == [r.id for r in sorted(requests, key=lambda r: r.arrival_at_s)]
    for o in result.outcomes:
        assert o.state is OutcomeState.COMPLETED, o
        assert o.dispatch_s is not None
        assert o.first_token_s is not None
        assert o.finish_s is not None
        assert o.arrival_s <= o.first_token_s <= o.finish_s
        assert o.arrival_s <= o.dispatch_s <= o.finish_s
    assert sum(o.evictions for o in result.outcomes) == result.evictions
    evicted = {a.request_id for a in result.interrupted}
    assert evicted == {o.request_id for o in result.outcomes if o.evictions}


@pytest.mark.parametrize(
    "policy",
    [
        *FAST_POLICIES,
        *(pytest.param(p, marks=pytest.mark.solver) for p in MILP_POLICIES),
    ],
)
def test_every_request_ends_exactly_once(policy: str) -> None:
    requests = mixed_requests(300, 20.0, 3)
    result = simulate(two_model_fleet(), requests, policy, CONFIG, 7)
    check_conservation(result, requests)
    assert result.completed == len(requests)
    assert 0.0 <= result.attainment() <= 1.0
    for value in result.attainment_by_class().values():
        assert 0.0 <= value <= 1.0
    assert 0.0 <= result.goodput_rps <= result.throughput_rps
    assert result.ttft_p50_s <= result.ttft_p99_s
    assert result.end_s == max(o.finish_s or 0.0 for o in result.outcomes)


@pytest.mark.parametrize("policy", [*FAST_POLICIES, pytest.param("qlm", marks=pytest.mark.solver)])
def test_same_inputs_and_seed_give_byte_identical_results(policy: str) -> None:
    """The MILP policies too: the simulator runs CP-SAT on a deterministic work budget."""
    first, second = run(policy), run(policy)
    assert first.canonical_json() == second.canonical_json()
    assert first.events_processed == second.events_processed


def test_different_workload_seeds_differ() -> None:
    assert run("edf", seed=3).canonical_json() != run("edf", seed=4).canonical_json()


@pytest.mark.parametrize(
    "policy", ["edf", "qlm-edf", pytest.param("qlm", marks=pytest.mark.solver)]
)
def test_nothing_runs_on_an_instance_while_it_loads_a_model(policy: str) -> None:
    # Two m7b instances, one m13b; mostly m13b traffic, heavy enough that a swap keeps more
    # promises than it breaks, makes policies that may swap do so. (At 400 requests the
    # m13b instance keeps all of its own: qlm no longer swaps there, rightly.)
    requests = mixed_requests(600, 120.0, 11, models=("m13b", "m13b", "m13b", "m7b"))
    result = simulate(two_model_fleet(), requests, policy, CONFIG, 7)
    check_conservation(result, requests)
    assert result.loads, "the case must make the policy swap a model"
    assert sum(result.swaps.values()) == len(result.loads)
    loads_on: dict[str, list[tuple[float, float]]] = {}
    for load in result.loads:
        assert load.end_s > load.start_s
        loads_on.setdefault(load.instance_id, []).append((load.start_s, load.end_s))
    spans = [(o.instance_id, o.dispatch_s, o.finish_s) for o in result.outcomes]
    spans += [(a.instance_id, a.dispatch_s, a.end_s) for a in result.interrupted]
    for instance_id, start_s, end_s in spans:
        assert instance_id is not None
        assert start_s is not None
        assert end_s is not None
        for load_start_s, load_end_s in loads_on.get(instance_id, []):
            assert end_s <= load_start_s or start_s >= load_end_s, (instance_id, start_s, end_s)
    model_of = {o.request_id: o.model for o in result.outcomes}
    for o in result.outcomes:  # and each ran where its model was loaded at the time
        loaded = [ld for ld in result.loads if ld.instance_id == o.instance_id]
        assert o.dispatch_s is not None
        before = [ld for ld in loaded if ld.end_s <= o.dispatch_s]
        if before:
            assert max(before, key=lambda ld: ld.end_s).model == model_of[o.request_id]


def test_requests_no_instance_serves_end_unfinished_and_the_run_stops() -> None:
    requests = mixed_requests(50, 10.0, 5, models=("m7b",))
    ghost = Request("ghost", "m70b", 100, 10, "batch-1", 1.0, 61.0)
    result = simulate(
        two_model_fleet(), [*requests, ghost], "fcfs", CONFIG, 1, options=SimConfig(stall_s=30.0)
    )
    states = {o.request_id: o.state for o in result.outcomes}
    assert states.pop("ghost") is OutcomeState.UNFINISHED
    assert set(states.values()) == {OutcomeState.COMPLETED}
    assert result.attainment() < 1.0
    last_finish_s = max(o.finish_s or 0.0 for o in result.outcomes)
    assert last_finish_s < result.end_s <= last_finish_s + 30.0 + 2.0


def test_max_time_cuts_the_run() -> None:
    requests = mixed_requests(200, 20.0, 5)
    result = simulate(
        two_model_fleet(), requests, "edf", CONFIG, 1, options=SimConfig(max_time_s=5.0)
    )
    assert result.end_s <= 5.0
    unfinished = [o for o in result.outcomes if o.state is OutcomeState.UNFINISHED]
    assert unfinished
    assert all(not o.met_slo for o in unfinished)
    assert all(o.finish_s is None for o in unfinished)


def test_progress_is_reported_up_to_the_total() -> None:
    seen: list[tuple[int, int]] = []
    requests = mixed_requests(120, 20.0, 5)
    simulate(
        two_model_fleet(), requests, "fcfs", CONFIG, 1, progress=lambda d, n: seen.append((d, n))
    )
    assert seen[-1] == (120, 120)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)


def test_queue_samples_count_waiting_requests() -> None:
    # All at t = 0: the first sample sees every request waiting, the last sees none.
    requests = [Request(f"r{i}", "m7b", 200, 50, "batch-2", 0.0, 3600.0) for i in range(200)]
    result = simulate(
        two_model_fleet(), requests, "edf", CONFIG, 1, options=SimConfig(sample_every_s=0.5)
    )
    index = result.slo_classes.index("batch-2")
    assert result.queue_samples[0].at_s == 0.0
    assert result.queue_samples[0].waiting[index] == 200
    counts = [s.waiting[index] for s in result.queue_samples]
    assert counts == sorted(counts, reverse=True)
    assert all(c >= 0 for s in result.queue_samples for c in s.waiting)
    times = [s.at_s for s in result.queue_samples]
    assert times == sorted(times)
    assert times[1] - times[0] == pytest.approx(0.5)


def test_summary_has_the_report_fields() -> None:
    summary = run("fcfs").summary()
    assert set(summary) == {
        "requests",
        "slo_attainment",
        "throughput_rps",
        "goodput_rps",
        "ttft_p50_s",
        "ttft_p99_s",
        "tbt_p50_ms",
        "tbt_p99_ms",
        "swaps",
        "evictions",
        "sim_wall_s",
    }
    assert summary["requests"] == 300
    assert set(summary["slo_attainment"]) == {"overall", "interactive", "batch-1", "batch-2"}


def test_unknown_policy_lists_the_known_ones() -> None:
    with pytest.raises(UnknownPolicyError, match="known: disagg, edf, fcfs"):
        run("nope")


class _PullsToTheWrongModel(BasePolicy):
    name = "wrong"

    def on_arrival(self, request: Request) -> Actions:
        return (Pull("b0", (request.id,)),)  # b0 serves m13b


class _Idle(BasePolicy):
    name = "idle"

    def on_engine_events(self, instance_id: str, events: Sequence[EngineEvent]) -> Actions:
        return NO_ACTIONS


def test_a_policy_asking_for_the_impossible_is_a_simulation_error() -> None:
    requests = mixed_requests(5, 1.0, 1, models=("m7b",))
    sim = Simulation(
        two_model_fleet(),
        requests,
        _PullsToTheWrongModel(),
        CONFIG,
        1,
        options=SimConfig(),
        progress=None,
        engine_factory=default_engine_factory,
    )
    with pytest.raises(SimulationError, match="needs m7b"):
        sim.run()


def test_a_policy_that_does_nothing_leaves_everything_unfinished() -> None:
    requests = mixed_requests(5, 1.0, 1)
    sim = Simulation(
        two_model_fleet(),
        requests,
        _Idle(),
        CONFIG,
        1,
        options=SimConfig(stall_s=10.0),
        progress=None,
        engine_factory=default_engine_factory,
    )
    result = sim.run()
    assert {o.state for o in result.outcomes} == {OutcomeState.UNFINISHED}
    assert result.attainment() == 0.0
    assert result.throughput_rps == 0.0


def test_sampled_output_lengths_follow_the_seed_not_the_placement() -> None:
    requests = mixed_requests(150, 20.0, 5, models=("m7b",))
    engines = SimulatedEngines(output_length="profile")

    def tokens(policy: str, seed: int) -> list[float]:
        result = simulate(two_model_fleet(), requests, policy, CONFIG, seed, engine_factory=engines)
        assert result.completed == len(requests)
        return [(o.finish_s or 0.0) - (o.first_token_s or 0.0) for o in result.outcomes]

    # Same seed: identical runs; another seed draws other lengths.
    assert tokens("fcfs", 1) == tokens("fcfs", 1)
    assert tokens("fcfs", 1) != tokens("fcfs", 2)
