"""Each policy's rule on a case built to show it, the ablations' switches, and a ranking sanity
check on an overloaded case."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from qlm.agents.reconcile import ReconcileConfig
from qlm.sim.policies import SIM_POLICIES, make_policy
from qlm.sim.policies.qlm import QlmPolicy, QlmVariant
from qlm.sim.result import OutcomeState, SimResult
from qlm.sim.simulate import SimConfig, Simulation, default_engine_factory, simulate
from qlm.types import Fleet, Request
from tests.factories import make_instance, make_profile
from tests.sim.cases import CLASSES, CONFIG, mixed_requests, two_model_fleet


def one_slot_fleet(instances: int = 1, models: tuple[str, ...] = ("m7b",)) -> Fleet:
    """Engines that run one request at a time: order of service is visible in the outcomes."""
    profiles = [make_profile(m, max_batch_size=1, step_s=(0.01,), batch_sizes=(1,)) for m in models]
    return Fleet.of(
        [make_instance(f"i{k}", loaded_model=models[0]) for k in range(instances)], profiles
    )


def req(
    id: str,
    at_s: float,
    slo_class: str = "batch-2",
    ttft_s: float = 3600.0,
    output: int = 100,
    model: str = "m7b",
) -> Request:
    return Request(id, model, 100, output, slo_class, at_s, at_s + ttft_s)


def outcome(result: SimResult, request_id: str) -> tuple[float, str | None]:
    o = next(o for o in result.outcomes if o.request_id == request_id)
    assert o.first_token_s is not None
    return o.first_token_s, o.instance_id


def test_every_policy_and_ablation_is_registered() -> None:
    assert set(SIM_POLICIES.names()) == {
        "fcfs",
        "edf",
        "shepherd",
        "llmd",
        "llmd-prefix",
        "preble",
        "round-robin",
        "serverless",
        "logos",
        "disagg",
        "qlm",
        "qlm-no-evict",
        "qlm-no-swap",
        "qlm-edf",
    }
    for name in SIM_POLICIES.names():
        assert make_policy(name).name == name


def test_fcfs_routes_to_the_least_loaded_instance_of_the_model_and_never_swaps() -> None:
    requests = [req(f"r{i}", 0.0, output=50) for i in range(6)]
    requests.append(req("other", 0.0, model="m13b"))  # nobody has m13b loaded
    fleet = one_slot_fleet(instances=3, models=("m7b", "m13b"))
    result = simulate(fleet, requests, "fcfs", CONFIG, 1, options=SimConfig(stall_s=60.0))
    placed = Counter(o.instance_id for o in result.outcomes if o.request_id != "other")
    assert placed == {"i0": 2, "i1": 2, "i2": 2}
    assert outcome(result, "r0")[1] == "i0"
    assert outcome(result, "r1")[1] == "i1"
    other = next(o for o in result.outcomes if o.request_id == "other")
    assert other.state is OutcomeState.UNFINISHED
    assert result.total_swaps == 0


def test_round_robin_takes_the_instances_in_turn_whatever_they_hold() -> None:
    requests = [req("long", 0.0, output=2000)] + [req(f"r{i}", 0.001 * (i + 1)) for i in range(5)]
    result = simulate(one_slot_fleet(instances=3), requests, "round-robin", CONFIG, 1)
    placed = [outcome(result, r.id)[1] for r in requests]
    assert placed == ["i0", "i1", "i2", "i0", "i1", "i2"]


def test_fcfs_serves_in_arrival_order_even_when_a_later_deadline_is_earlier() -> None:
    requests = [req("first", 0.0), req("second", 0.1), req("urgent", 0.2, "interactive", 5.0)]
    result = simulate(one_slot_fleet(), requests, "fcfs", CONFIG, 1)
    assert outcome(result, "second")[0] < outcome(result, "urgent")[0]


def test_edf_serves_the_earliest_deadline_first() -> None:
    requests = [req("first", 0.0), req("second", 0.1), req("urgent", 0.2, "interactive", 5.0)]
    result = simulate(one_slot_fleet(), requests, "edf", CONFIG, 1)
    assert outcome(result, "urgent")[0] < outcome(result, "second")[0]
    assert result.attainment() == 1.0


def test_edf_swaps_an_idle_instance_to_a_model_that_waits() -> None:
    fleet = one_slot_fleet(instances=2, models=("m7b", "m13b"))
    requests = [req(f"b{i}", 0.0, model="m13b") for i in range(4)]
    result = simulate(fleet, requests, "edf", CONFIG, 1)
    assert result.total_swaps == 2  # both idle m7b instances take the m13b backlog
    assert {ld.model for ld in result.loads} == {"m13b"}
    assert all(o.state is OutcomeState.COMPLETED for o in result.outcomes)


def test_shepherd_preempts_a_later_deadline_request_for_one_that_would_miss() -> None:
    requests = [req("long", 0.0, output=2000), req("urgent", 1.0, "interactive", 2.0, output=5)]
    result = simulate(one_slot_fleet(), requests, "shepherd", CONFIG, 1)
    assert result.evictions == 1
    assert result.policy_stats["preemptions"] == 1
    assert outcome(result, "urgent")[0] <= 3.0
    assert {o.request_id: o.met_slo for o in result.outcomes} == {"long": True, "urgent": True}
    # edf on the same case does not preempt, and the urgent request misses
    edf = simulate(one_slot_fleet(), requests, "edf", CONFIG, 1)
    assert edf.evictions == 0
    assert outcome(edf, "urgent")[0] > 3.0


def test_shepherd_keeps_the_static_partition() -> None:
    result = simulate(two_model_fleet(), mixed_requests(200, 40.0, 2), "shepherd", CONFIG, 1)
    assert result.total_swaps == 0
    for o in result.outcomes:
        assert (o.instance_id or "").startswith("b" if o.model == "m13b" else "a")


def test_llmd_serves_higher_bands_first_then_earliest_deadline() -> None:
    # One slot and a queue threshold of 1: the gateway holds everything while the engine has a
    # request that has not started.
    requests = [
        req("b2", 0.0, "batch-2"),  # dispatched at once; the rest arrive during its prefill
        req("b1-late", 0.001, "batch-1", 600.0),
        req("b1-early", 0.002, "batch-1", 60.0),
        req("inter", 0.003, "interactive", 20.0),
    ]
    result = simulate(
        one_slot_fleet(), requests, "llmd", CONFIG, 1, policy_options={"queue_threshold": 1}
    )
    order = sorted(requests, key=lambda r: outcome(result, r.id)[0])
    assert [r.id for r in order] == ["b2", "inter", "b1-early", "b1-late"]


def test_llmd_routes_to_the_best_scored_instance() -> None:
    # Ties go to fleet order; then the instance holding work scores lower on queue and KV.
    fleet = Fleet.of(
        [make_instance("small", memory_gib=24.0), make_instance("big", memory_gib=80.0)],
        [make_profile(weight_gib=14.0, min_kv_tokens=1000)],
    )
    requests = [
        Request("r0", "m7b", 4000, 10, "batch-2", 0.0, 3600.0),
        Request("r1", "m7b", 4000, 10, "batch-2", 0.0, 3600.0),
    ]
    result = simulate(fleet, requests, "llmd", CONFIG, 1)
    assert outcome(result, "r0")[1] == "small"
    assert outcome(result, "r1")[1] == "big"


def test_qlm_runs_the_controller_and_reconcile() -> None:
    """(Eviction: test_qlm_evicts_only_when_room_would_not_free_in_time.)"""
    requests = mixed_requests(400, 60.0, 3)
    result = simulate(two_model_fleet(), requests, "qlm-edf", CONFIG, 1)
    stats = result.policy_stats
    assert stats["replans"] >= 1
    assert stats["plans_heuristic"] == stats["replans"]  # qlm-edf: the EDF planner
    assert stats["lso_pull"] > 0
    offered = 400 + stats.get("requeued_offered", 0)  # evicted ones the plan forgot
    assert stats["arrivals_inserted"] + stats["arrivals_outside_plan"] == offered


@pytest.mark.solver
def test_qlm_ablations_switch_off_what_they_name() -> None:
    # Load the m13b instance cannot keep alone (at 400 requests it keeps all: no swap).
    requests = mixed_requests(600, 120.0, 11, models=("m13b", "m13b", "m13b", "m7b"))
    full = simulate(two_model_fleet(), requests, "qlm", CONFIG, 1)
    no_evict = simulate(two_model_fleet(), requests, "qlm-no-evict", CONFIG, 1)
    no_swap = simulate(two_model_fleet(), requests, "qlm-no-swap", CONFIG, 1)
    assert full.total_swaps > 0
    assert no_evict.evictions == 0
    assert no_swap.total_swaps == 0
    assert full.policy_stats["replans"] > 0
    assert full.policy_stats.get("plans_heuristic", 0) == 0  # the MILP planned


def _long_batch_then_interactive() -> list[Request]:
    """Batch-2 requests with 4,000-token outputs fill every m7b slot at t=0; interactive
    requests arrive at t=5, when no slot would free for minutes."""
    batch = [Request.create(f"b{i}", "m7b", 200, 4000, CLASSES["batch-2"], 0.0) for i in range(64)]
    urgent = [
        Request.create(f"i{i}", "m7b", 200, 50, CLASSES["interactive"], 5.0 + 0.1 * i)
        for i in range(8)
    ]
    return batch + urgent


@pytest.mark.solver
def test_qlm_evicts_only_when_room_would_not_free_in_time() -> None:
    fleet = two_model_fleet(num_7b=1, num_13b=0)
    requests = _long_batch_then_interactive()
    full = simulate(fleet, requests, "qlm", CONFIG, 1)
    no_evict = simulate(fleet, requests, "qlm-no-evict", CONFIG, 1)
    assert full.evictions > 0
    assert no_evict.evictions == 0
    assert full.attainment_by_class()["interactive"] == 1.0
    assert no_evict.attainment_by_class()["interactive"] == 0.0
    # Interactive requests that room frees for in time are not worth a preemption.
    short = [replace(r, max_output_tokens=20) if r.slo_class == "batch-2" else r for r in requests]
    assert simulate(fleet, short, "qlm", CONFIG, 1).evictions == 0


def test_qlm_shortcuts_decide_exactly_as_full_agent_steps() -> None:
    requests = mixed_requests(400, 60.0, 5) + _long_batch_then_interactive()  # + evictions
    results = [
        Simulation(
            two_model_fleet(num_7b=1),
            requests,
            QlmPolicy(QlmVariant(planner="edf", shortcuts=shortcuts), "qlm-edf"),
            CONFIG,
            1,
            options=SimConfig(),
            progress=None,
            engine_factory=default_engine_factory,
        ).run()
        for shortcuts in (True, False)
    ]
    assert results[0].evictions > 0
    assert results[0].canonical_json() == results[1].canonical_json()


def test_qlm_dispatch_does_not_wait_for_the_first_plan() -> None:
    """Planning latency delays plans (swaps), never dispatch: an instance with room serves
    its model's queue at once (qlm/agents/dispatch.py)."""
    requests = [req(f"r{i}", 0.0, "interactive", 20.0, output=10) for i in range(3)]
    fast = simulate(one_slot_fleet(), requests, "qlm-edf", CONFIG, 1)
    slow = simulate(
        one_slot_fleet(),
        requests,
        "qlm-edf",
        CONFIG,
        1,
        policy_options={"planning_latency_s": 2.0},
    )
    assert min(o.dispatch_s or 0.0 for o in fast.outcomes) == 0.0
    assert min(o.dispatch_s or 0.0 for o in slow.outcomes) == 0.0
    assert slow.outcomes == fast.outcomes


@pytest.mark.solver
def test_ranking_on_an_overloaded_case() -> None:
    """60 req/s on a fleet that serves about 15: QLM keeps interactive requests on time."""
    requests = mixed_requests(800, 60.0, 3)
    attained = {
        policy: simulate(two_model_fleet(), requests, policy, CONFIG, 7).attainment()
        for policy in ("fcfs", "edf", "qlm")
    }
    assert attained["fcfs"] < 0.9
    assert attained["qlm"] >= attained["edf"] >= attained["fcfs"]
    assert attained["qlm"] >= attained["fcfs"] + 0.1


def test_reconcile_options_reach_the_agents() -> None:
    policy = make_policy("qlm-no-evict")
    assert isinstance(policy, QlmPolicy)
    assert policy.variant.reconcile == ReconcileConfig(allow_evict=False)
    no_swap = make_policy("qlm-no-swap")
    assert isinstance(no_swap, QlmPolicy)
    assert not no_swap.variant.reconcile.allow_model_swap
    assert no_swap.variant.pin_models
