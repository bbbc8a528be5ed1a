"""Engine timing for dispatch (qlm/agents/drain.py): a loading engine's busy time (what is left
of its load, a wake's when the model woke from the standby tier, not always a cold load's),
and how long admitted work delays a new request's first token."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qlm.agents.drain import (
    drain_estimate_s,
    load_left_s,
    prefill_rate_beside,
    start_blocks_by_rank,
)
from qlm.engine.engine_types import EngineObservation, EngineRequest, EngineState
from tests.engine.helpers import exact_profile
from tests.factories import make_profile


def test_a_wake_in_progress_is_priced_as_what_is_left_of_the_wake() -> None:
    profile = replace(make_profile("m7b"), load_s=40.0, wake_s=0.5)
    loading = EngineObservation("i", EngineState.LOADING, "m7b", (), 0, 1000, 8)
    assert drain_estimate_s(loading, profile) == pytest.approx(40.0)  # unknown: cold
    assert drain_estimate_s(loading, profile, load_left_s(profile, True, 0.2)) == pytest.approx(0.3)
    assert load_left_s(profile, False, 10.0) == pytest.approx(30.0)
    assert load_left_s(profile, True, 5.0) == 0.0
    assert load_left_s(None, True, 0.0) is None
    ready = replace(loading, state=EngineState.READY)
    assert drain_estimate_s(ready, profile, 12.0) == 0.0  # not loading: no load counted


def test_a_new_request_waits_for_queued_prompts_of_its_rank_and_room_not_for_decodes() -> None:
    """`start_blocks_by_rank`: decoding sequences do not delay a new request's first token
    (it joins their batch); admitted prompts of its rank or above not prefilled yet do, at
    the prefill lane's rate beside those decodes; a full engine holding only work it may not
    preempt makes it wait for the first of those to end; a load in progress comes first."""
    profile = exact_profile(max_batch_size=8)
    rank = {"interactive": 2, "batch": 1}.__getitem__
    decoding = EngineRequest("d", "interactive", 400, 300, 10, True)
    obs = EngineObservation("i", EngineState.READY, "m", (decoding,), 410, 100_000, 8)
    assert start_blocks_by_rank(obs, profile, lambda r: rank(r.slo_class), (1, 2)) == {
        1: 0.0,
        2: 0.0,
    }
    queued = (
        EngineRequest("qi", "interactive", 1_000, 50, 0, False),
        EngineRequest("qb", "batch", 3_000, 50, 0, False),
    )
    obs = replace(obs, requests=(decoding, *queued))
    lane = prefill_rate_beside(profile, 1, decoding.context_tokens)
    blocks = start_blocks_by_rank(obs, profile, lambda r: rank(r.slo_class), (1, 2))
    assert blocks[2] == pytest.approx(1_000 / lane)  # the batch prompt goes after it
    assert blocks[1] == pytest.approx(4_000 / lane)
    # Full (no slot): only work it may not preempt holds it back, until the first one ends.
    full = replace(obs, requests=(decoding,), max_num_seqs=1)
    step_s = profile.decode_step_s_at(1)
    blocks = start_blocks_by_rank(full, profile, lambda r: rank(r.slo_class), (1, 2, 3))
    assert blocks[2] == pytest.approx(290 * step_s)
    assert blocks[1] == pytest.approx(290 * step_s)
    assert blocks[3] == 0.0  # it outranks what is there: preemption makes room
    full_of_batch = replace(full, requests=(decoding._replace(slo_class="batch"),))
    assert start_blocks_by_rank(full_of_batch, profile, lambda r: rank(r.slo_class), (2,)) == {
        2: 0.0
    }
    loading = EngineObservation("i", EngineState.LOADING, "m", (), 0, 100_000, 8)
    assert start_blocks_by_rank(loading, profile, lambda r: 0, (0,), 3.5) == {0: 3.5}
