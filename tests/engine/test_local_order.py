"""The engine model's srpt-mlfq order (Prophet; the native engine's local policy of the same
name): short prompts pass a long one in prefill, the starvation bound gives the long one its
turn, and preemption takes the most served sequence instead of the latest admitted."""

from __future__ import annotations

from dataclasses import replace

from qlm.config.engine_config import EngineConfig
from qlm.engine.model.core import EngineModel
from qlm.engine.model.scheduler import mlfq_victim
from qlm.types import PrefixBlock
from tests.engine.helpers import engine, finishes, first_tokens, req, run_all


def _engine(order: str, **fields: object) -> EngineModel:
    settings = {"waiting_order": order, "chunk_tokens": 64, "max_num_seqs": 8} | fields
    return engine(config=EngineConfig.model_validate(settings))


def _long_then_shorts(model: EngineModel, shorts: int, gap_s: float) -> dict[str, float]:
    """A 2,000-token prompt at 0, then `shorts` 20-token prompts every `gap_s`: first tokens."""
    model.add(req("long", prompt=2000, output=2), 0.0)
    events = []
    for i in range(shorts):
        at_s = 0.001 + i * gap_s
        events += model.advance_to(at_s)
        model.add(req(f"s{i}", prompt=20, output=2, at_s=at_s), at_s)
    return first_tokens(events + run_all(model))


def test_short_prompts_pass_a_long_one_in_prefill() -> None:
    fcfs = _long_then_shorts(_engine("fcfs"), shorts=4, gap_s=0.0)
    srpt = _long_then_shorts(_engine("srpt-mlfq"), shorts=4, gap_s=0.0)
    short = [f"s{i}" for i in range(4)]
    # fcfs: the long prompt's 32 chunks come first; srpt: the shorts go at once
    assert all(fcfs[s] > fcfs["long"] * 0.9 for s in short)
    assert max(srpt[s] for s in short) < 0.2 * min(fcfs[s] for s in short)
    assert srpt["long"] > fcfs["long"]  # it yields, briefly


def test_the_starvation_bound_gives_a_long_prompt_its_turn() -> None:
    # a short prompt every ~iteration keeps SRPT busy with shorts for as long as they come
    unbounded = _long_then_shorts(
        _engine("srpt-mlfq", max_wait_iterations=10**9, chunk_tokens=24), shorts=300, gap_s=0.011
    )
    bounded = _long_then_shorts(
        _engine("srpt-mlfq", max_wait_iterations=20, chunk_tokens=24), shorts=300, gap_s=0.011
    )
    last_short_s = max(v for k, v in unbounded.items() if k != "long")
    assert unbounded["long"] >= last_short_s  # starved until the stream ended
    assert bounded["long"] < 0.5 * unbounded["long"]
    assert all(k in bounded for k in [f"s{i}" for i in range(300)])


def test_preemption_takes_the_most_served_sequence() -> None:
    def victim_of(order: str) -> str:
        model = _engine(order)
        model.add(req("old", prompt=10, output=500), 0.0)
        model.advance_to(1.0)  # "old" has generated many tokens
        model.add(req("new", prompt=10, output=500, at_s=1.0), 1.0)
        model.advance_to(1.1)
        queues = model._queues
        if order == "srpt-mlfq":
            return mlfq_victim(queues).id
        return next(reversed(queues.running))

    assert victim_of("fcfs") == "new"
    assert victim_of("srpt-mlfq") == "old"


def test_srpt_mlfq_preempts_the_most_served_when_kv_runs_out() -> None:
    def new_finished_s(order: str) -> float:
        config = EngineConfig.model_validate({"waiting_order": order, "chunk_tokens": 64})
        model = engine(capacity_tokens=700, config=config)
        model.add(req("old", prompt=10, output=600), 0.0)
        events = model.advance_to(4.0)  # "old" is some 300 tokens in
        model.add(req("new", prompt=100, output=200, at_s=4.0), 4.0)
        done = finishes(events + run_all(model))
        assert set(done) == {"old", "new"}
        assert model.stats.preemptions_recompute >= 1  # 610 + 300 tokens > 700
        return done["new"].at_s - 4.0

    # fcfs preempts "new" (the latest admitted) and it waits for "old" to end; srpt-mlfq
    # preempts "old" (the most served), so "new" ends first
    assert new_finished_s("srpt-mlfq") < 0.75 * new_finished_s("fcfs")


def test_prefix_groups_bound_the_wait_of_a_request_the_cache_misses() -> None:
    """One slot; a miss arrives while hits (the same cached 100 tokens) keep coming: Preble's
    groups put every hit first, so without the bound the miss waits for the stream's end."""

    def miss_first_token_s(bound: int) -> tuple[float, float]:
        model = _engine("prefix-groups", max_num_seqs=1, max_wait_iterations=bound)
        hot = (PrefixBlock(1, 100),)
        model.add(replace(req("warm", prompt=101, output=1), prefix=hot), 0.0)
        events = model.advance_to(0.5)
        model.add(req("busy", prompt=10, output=20, at_s=0.5), 0.5)  # the slot is taken
        model.add(req("miss", prompt=101, output=1, at_s=0.5), 0.5)
        for i in range(200):
            at_s = 0.501 + 0.001 * i
            events += model.advance_to(at_s)
            model.add(replace(req(f"h{i}", prompt=101, output=1, at_s=at_s), prefix=hot), at_s)
        firsts = first_tokens(events + run_all(model))
        return firsts["miss"], max(firsts.values())

    bounded, _ = miss_first_token_s(10)
    unbounded, last = miss_first_token_s(10**9)
    assert unbounded == last  # starved to the end
    assert bounded < 0.3 * unbounded
