"""The simulator's speed-ups keep results exact: a kept observation is the one a fresh engine
would give, a pool priced once per kind of member costs what pricing every member costs, and
the drains of every class from one pass are the drains computed class by class. (Any drift
here would also move the pinned digests of tests/sim/test_pinned_outputs.py; these name the
part that broke.)"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from qlm.agents.dispatch import PoolMember, PoolRate
from qlm.agents.drain import drain_estimate_s, drains_by_rank
from qlm.agents.reconcile import QueuedItem
from qlm.engine.engine_types import EngineObservation, EngineRequest, EngineState
from qlm.engine.model.core import EngineModel
from tests.engine.helpers import engine, exact_profile, req
from tests.factories import make_profile

# (time, operation) pairs applied to an engine model, several at one instant.
Op = Callable[[EngineModel, float], None]
OPS: list[tuple[float, Op]] = [
    (0.0, lambda m, t: m.add(req("a", prompt=300, output=40), t)),
    (0.0, lambda m, t: m.add(req("b", prompt=50, output=5), t)),
    (0.03, lambda m, t: m.add(req("c", prompt=80, output=30), t)),
    (0.03, lambda m, t: m.abort(["b"], t)),
    (0.2, lambda m, t: m.add(req("d", prompt=20, output=3), t)),
    (0.35, lambda m, t: m.abort(["a"], t)),
    (0.35, lambda m, t: m.add(req("e", prompt=10, output=2), t)),
]


def test_a_kept_observation_is_what_a_fresh_engine_reports() -> None:
    """One engine observed before and after every operation (reusing its kept observation
    where nothing changed) and one observed only at each check agree at every check."""
    watched, fresh = engine(), engine()
    for at_s, op in OPS:
        before = watched.observe(at_s)
        assert watched.observe(at_s) is before  # nothing changed: kept
        op(watched, at_s)
        op(fresh, at_s)
        after = watched.observe(at_s)
        assert after is not before
        assert after == fresh.observe(at_s)
        assert after.requests == fresh.observe(at_s).requests
    for at_s in (0.4, 0.5, 1.0):  # time alone moves outputs on and ends requests
        assert watched.observe(at_s).requests == fresh.observe(at_s).requests


def test_observation_splits_active_and_swapped_from_its_requests() -> None:
    on_gpu = EngineRequest("a", "interactive", 10, 5, 1, True)
    on_cpu = EngineRequest("b", "batch-2", 10, 5, 2, True, kv_on_cpu=True)
    obs = EngineObservation("i", EngineState.READY, "m", (on_gpu, on_cpu), 30, 1_000, 8)
    assert obs.active == (on_gpu,)
    assert obs.swapped == (on_cpu,)
    assert replace(obs, requests=(on_cpu,)).active == ()


def test_a_pool_priced_by_kind_costs_what_every_member_costs() -> None:
    a100, a10 = make_profile("m7b", "A100"), make_profile("m7b", "A10", step_s=(0.05, 0.06, 0.09))
    members = (
        PoolMember(a100, 60_000, 64),
        PoolMember(a10, 20_000, 32),
        PoolMember(a100, 60_000, 64),
        PoolMember(a100, 30_000, 64),  # same profile, less KV: a kind of its own
        PoolMember(a10, 20_000, 32),
    )
    rate = PoolRate(members)
    for prompt, output in ((10, 5), (900, 300), (25_000, 200), (59_000, 900)):
        item = QueuedItem("r", prompt, output)
        costs = [m.cost_s(prompt, output) for m in members]
        pool_s = 1.0 / sum(1.0 / max(c, 1e-9) for c, _ in costs)
        prefill_s = sum(p for _, p in costs) / len(costs)
        assert rate.cost_s(item) == (pool_s, prefill_s)  # bit for bit


def _drain_by_hand(obs: EngineObservation, keep: tuple[EngineRequest, ...]) -> float:
    """The drain estimate written out (qlm/agents/drain.py's formula) over `keep`."""
    profile = exact_profile()
    load_s = profile.load_s if obs.state is EngineState.LOADING else 0.0
    active = [r for r in keep if not r.kv_on_cpu]
    if not active:
        return load_s
    left = sum(max(0, r.max_output_tokens - r.output_tokens) for r in active)
    prefill = sum(r.prompt_tokens for r in active if not r.started)
    batch = min(len(active), profile.max_batch_size)
    return load_s + left / profile.token_throughput_per_s(batch) + profile.prefill_s(prefill)


def test_drains_of_every_class_in_one_pass_match_class_by_class() -> None:
    priority = {"interactive": 3, "batch-1": 2, "batch-2": 1}
    requests = (
        EngineRequest("a", "interactive", 400, 100, 10, True),
        EngineRequest("b", "batch-1", 2_000, 300, 0, False),
        EngineRequest("c", "batch-2", 800, 500, 480, True),
        EngineRequest("d", "unknown", 100, 50, 60, True),  # past its cap; rank 0
        EngineRequest("e", "batch-2", 300, 50, 0, False, kv_on_cpu=True),  # not active
    )
    profile = exact_profile()
    for state in (EngineState.READY, EngineState.LOADING):
        obs = EngineObservation("i", state, "m", requests, 5_000, 100_000, 64)
        by_rank = drains_by_rank(
            obs, profile, lambda r: priority.get(r.slo_class, 0), priority.values()
        )
        for rank in priority.values():
            keep = tuple(r for r in requests if priority.get(r.slo_class, 0) >= rank)
            assert by_rank[rank] == _drain_by_hand(obs, keep)  # bit for bit
        assert drain_estimate_s(obs, profile) == _drain_by_hand(obs, requests)
    empty = EngineObservation("i", EngineState.READY, "m", (), 0, 100_000, 64)
    assert drains_by_rank(empty, profile, lambda _: 0, (0, 1)) == {0: 0.0, 1: 0.0}
