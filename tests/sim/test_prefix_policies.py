"""Prefix-aware routing: the router's prefix index, and the `llmd-prefix` and `preble`
baselines' rules on cases built to show them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from qlm.config import QlmConfig
from qlm.engine.engine_types import EngineObservation, EngineRequest, EngineState
from qlm.prefixes.index import PrefixIndex
from qlm.sim.policies.preble import not_prefilling
from qlm.sim.result import SimResult
from qlm.sim.scenario import load_scenario
from qlm.sim.simulate import simulate
from qlm.types import PrefixBlock, Request
from tests.sim.cases import two_model_fleet

ROOT = Path(__file__).resolve().parents[2]
SHARED = (PrefixBlock(11, 900), PrefixBlock(12, 50))
OTHER = (PrefixBlock(21, 900),)


def req(id: str, at_s: float, prefix: tuple[PrefixBlock, ...], prompt: int = 1000) -> Request:
    request = Request(id, "m7b", prompt, 20, "batch-2", at_s, at_s + 3600.0)
    return replace(request, prefix=prefix)


def instance_of(result: SimResult, request_id: str) -> str | None:
    return next(o.instance_id for o in result.outcomes if o.request_id == request_id)


def test_the_index_matches_leading_blocks_and_forgets_the_oldest_trailing_ones() -> None:
    index = PrefixIndex([("a", 1000)])
    index.record("a", SHARED)
    assert index.matched_tokens("a", SHARED) == 950
    assert index.matched_tokens("a", (PrefixBlock(12, 50),)) == 50  # keys name whole texts
    assert index.matched_tokens("b", SHARED) == 0
    assert index.evicted_by("a", 40) == []
    assert index.evicted_by("a", 60) == [(12, 50)]  # the trailing block first
    assert index.evicted_by("a", 101) == [(12, 50), (11, 900)]
    index.record("a", (PrefixBlock(31, 100),))
    assert index.matched_tokens("a", SHARED) == 900  # the trailing block went to make room
    index.forget("a")
    assert index.matched_tokens("a", SHARED) == 0


def test_llmd_prefix_sends_a_shared_prefix_where_it_went_and_llmd_does_not() -> None:
    fleet = two_model_fleet(num_7b=2, num_13b=0)
    requests = [req("r1", 0.0, SHARED), req("r2", 0.001, SHARED)]
    plain = simulate(fleet, requests, "llmd", QlmConfig(), 0)
    aware = simulate(fleet, requests, "llmd-prefix", QlmConfig(), 0)
    assert instance_of(plain, "r1") != instance_of(plain, "r2")  # the queue scorer spreads
    assert instance_of(aware, "r1") == instance_of(aware, "r2")
    assert aware.prefix_tokens[instance_of(aware, "r2") or ""][1] == 950


def test_preble_exploits_a_long_cached_prefix_and_explores_for_a_new_one() -> None:
    fleet = two_model_fleet(num_7b=2, num_13b=0)
    requests = [req("r1", 0.0, SHARED), req("r2", 0.001, SHARED), req("r3", 0.002, OTHER)]
    result = simulate(fleet, requests, "preble", QlmConfig(), 0)
    first = instance_of(result, "r1")
    assert instance_of(result, "r2") == first  # 950 cached > 50 missed: exploit
    assert instance_of(result, "r3") != first  # nothing cached: the lighter instance


def test_preble_rebalances_an_exploit_away_from_an_overloaded_instance() -> None:
    fleet = two_model_fleet(num_7b=2, num_13b=0)
    # 950 of 1,800 tokens cached: each exploit still adds 850 tokens of prefill to one instance
    requests = [req(f"r{k}", k * 0.001, SHARED, prompt=1800) for k in range(6)]
    result = simulate(fleet, requests, "preble", QlmConfig(), 0)
    assert len({instance_of(result, f"r{k}") for k in range(6)}) == 2
    never = simulate(
        fleet, requests, "preble", QlmConfig(), 0, policy_options={"balance_ratio": 1e9}
    )
    assert len({instance_of(never, f"r{k}") for k in range(6)}) == 1


def test_prefix_aware_routers_reuse_more_than_a_least_loaded_one() -> None:
    scenario = load_scenario(ROOT / "sims" / "prefix-quick.yaml")
    scenario = scenario.model_copy(update={"horizon_s": 20.0})
    requests = [r for r in scenario.requests(0) if r.arrival_at_s < 20.0]
    reuse = {
        name: simulate(scenario.fleet(), requests, name, scenario.config, 0).prefix_reuse()
        for name in ("fcfs", "preble")
    }
    assert reuse["fcfs"] is not None
    assert reuse["preble"] is not None
    assert reuse["preble"]["reuse"] > reuse["fcfs"]["reuse"] + 0.05


def test_by_affinity_serves_its_own_prefixes_first_and_leaves_others_last() -> None:
    from qlm.agents.dispatch import by_affinity
    from qlm.agents.queued import QueuedItem

    names = ("theirs", "plain", "mine", "theirs2", "mine2", "plain2")
    items = [QueuedItem(name, 1000, 10) for name in names]
    sides = {"theirs": -1, "plain": 0, "mine": 1, "theirs2": -1, "mine2": 1, "plain2": 0}
    ordered = by_affinity(items, lambda item: sides[item.request_id])
    # this instance's own first, then the rest, then another's: schedule order in each
    assert [item.request_id for item in ordered] == [
        "mine",
        "mine2",
        "plain",
        "plain2",
        "theirs",
        "theirs2",
    ]


def test_qlm_keeps_shared_prefixes_together_more_than_a_prefix_blind_gateway() -> None:
    scenario = load_scenario(ROOT / "sims" / "prefix-quick.yaml")
    requests = [r for r in scenario.requests(0) if r.arrival_at_s < 20.0]
    reuse = {}
    for name in ("llmd", "qlm"):
        found = simulate(scenario.fleet(), requests, name, scenario.config, 0).prefix_reuse()
        assert found is not None
        reuse[name] = found["reuse"]
    assert reuse["qlm"] > reuse["llmd"] + 0.03  # 0.65 against 0.60 (0.61 without affinity)


def test_preble_brings_its_local_scheduler_to_its_engines() -> None:
    from qlm.types import Fleet
    from tests.factories import make_instance, make_profile

    profile = make_profile("m7b", max_batch_size=1, step_s=(0.01,), batch_sizes=(1,))
    fleet = Fleet.of([make_instance("i0", loaded_model="m7b")], [profile])
    warm = req("warm", 0.0, SHARED)
    # 50 tokens: fewer iterations than the starvation bound (64), past which the oldest
    # waiting request goes first whatever its cache hits
    busy = replace(req("busy", 5.0, ()), max_output_tokens=50)
    cold = req("cold", 5.001, OTHER)
    hot = req("hot", 5.002, SHARED)
    firsts = {}
    for name in ("fcfs", "preble"):
        result = simulate(fleet, [warm, busy, cold, hot], name, QlmConfig(), 0)
        starts = {o.request_id: o.first_token_s for o in result.outcomes}
        firsts[name] = min(("cold", "hot"), key=lambda rid: starts[rid] or float("inf"))
    # one slot, held by `busy`: the engine's own order decides who goes next
    assert firsts == {"fcfs": "cold", "preble": "hot"}


def test_qlm_leaves_a_request_to_the_busy_instance_holding_its_prefix() -> None:
    fleet = two_model_fleet(num_7b=2, num_13b=0)
    first = replace(req("first", 0.0, SHARED), max_output_tokens=2000)  # keeps its instance busy
    again = req("again", 1.0, SHARED)  # the other instance is idle, and offered it first
    result = simulate(fleet, [first, again], "qlm", QlmConfig(), 0)
    assert instance_of(result, "again") == instance_of(result, "first")
    assert result.prefix_tokens[instance_of(result, "again") or ""][1] == 950


def test_preble_explores_onto_an_instance_that_only_decodes_while_another_prefills() -> None:
    """Four long decodes share half their prompts on one instance (4,000 + 3 x 1,900 tokens
    of prefill in its window); the other takes a 6,000-token prompt. A request explored while
    that prompt prefills goes, by the window's load cost, behind it; Preble's prefill/decode
    balance sends it to the instance whose batch only decodes, and its first token comes
    sooner."""
    fleet = two_model_fleet(num_7b=2, num_13b=0)
    decodes = [
        replace(
            Request(f"d{k}", "m7b", 4000, 2000, "batch-2", k * 0.001, 3600.0),
            prefix=(PrefixBlock(41, 2100),),
        )
        for k in range(4)
    ]
    prompt = req("p", 2.0, (PrefixBlock(51, 5990),), prompt=6000)
    probe = req("x", 2.01, (PrefixBlock(61, 990),))
    runs = {
        balance: simulate(
            fleet,
            [*decodes, prompt, probe],
            "preble",
            QlmConfig(),
            0,
            policy_options={"balance_ratio": 1e9, "pd_balance": balance},
        )
        for balance in (False, True)
    }
    decoding = instance_of(runs[True], "d0")
    assert {instance_of(run, f"d{k}") for run in runs.values() for k in range(4)} == {decoding}
    assert instance_of(runs[True], "p") == instance_of(runs[False], "p") != decoding
    assert instance_of(runs[False], "x") == instance_of(runs[False], "p")  # the load cost
    assert instance_of(runs[True], "x") == decoding  # the shortcut
    ttft = {b: next(o.ttft_s for o in r.outcomes if o.request_id == "x") for b, r in runs.items()}
    shortcut, load_cost = ttft[True], ttft[False]
    assert shortcut is not None
    assert load_cost is not None
    assert shortcut < load_cost
    # a third, idle instance is free of prefills too, and the cheapest of the free ones
    three = two_model_fleet(num_7b=3, num_13b=0)
    options = {"balance_ratio": 1e9, "pd_balance": True}
    wider = simulate(
        three, [*decodes, prompt, probe], "preble", QlmConfig(), 0, policy_options=options
    )
    used = {instance_of(wider, r) for r in ("d0", "p")}
    assert instance_of(wider, "x") not in used


def test_not_prefilling_needs_an_instance_prefilling_and_room_elsewhere() -> None:
    def obs(
        instance_id: str, started: tuple[bool, ...], max_num_seqs: int = 8, kv_used: int = 0
    ) -> EngineObservation:
        requests = tuple(
            EngineRequest(f"{instance_id}{k}", "batch-2", 100, 50, int(s), s)
            for k, s in enumerate(started)
        )
        return EngineObservation(
            instance_id, EngineState.READY, "m7b", requests, kv_used, 10_000, max_num_seqs
        )

    prefilling, light, heavy = obs("a", (False, True)), obs("b", (True,)), obs("c", (True,) * 3)
    assert not_prefilling([prefilling, light, heavy], 100) == ["b", "c"]
    assert not_prefilling([light, heavy], 100) == []  # nobody waits for a prefill: balanced
    assert not_prefilling([prefilling, obs("d", ())], 100) == ["d"]  # idle counts as free
    assert not_prefilling([prefilling, obs("e", (True,) * 8)], 100) == []  # no free slot
    assert not_prefilling([prefilling, obs("f", (True,), kv_used=9_950)], 100) == []  # no room


def test_a_prefix_hotter_than_one_instance_is_replicated_and_kept() -> None:
    """One prompt prefix at 6 requests a second (3,000 shared tokens, 2,000 of their own, 200
    out, first token due in 2 s) is more than one instance serves: alone, one keeps under
    95 % of them. qlm (work-conserving dispatch) and preble (its rebalance) serve the prefix
    from both instances, each caching it (Preble's replication of a hot prefix), and keep
    >= 95 %; preble without its rebalance sends every exploit to the first holder."""
    hot = (PrefixBlock(71, 3000),)
    times = np.cumsum(np.random.default_rng(0).exponential(1 / 6, 200))
    requests = [
        replace(
            Request(f"h{k}", "m7b", 5000, 200, "interactive", float(t), float(t) + 2.0), prefix=hot
        )
        for k, t in enumerate(times)
    ]
    one, two = two_model_fleet(num_7b=1, num_13b=0), two_model_fleet(num_7b=2, num_13b=0)
    for name in ("qlm", "preble"):
        assert simulate(one, requests, name, QlmConfig(), 0).attainment() < 0.95
        result = simulate(two, requests, name, QlmConfig(), 0)
        assert result.attainment() >= 0.95
        assert {o.instance_id for o in result.outcomes} == {"a0", "a1"}
        assert all(result.prefix_tokens[i][1] > 0 for i in ("a0", "a1"))  # cached on both
    options = {"balance_ratio": 1e9}
    stuck = simulate(two, requests, "preble", QlmConfig(), 0, policy_options=options)
    assert {o.instance_id for o in stuck.outcomes} == {"a0"}
    assert stuck.attainment() < 0.5
