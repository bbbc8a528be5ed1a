"""The prefill/decode split in the engine model: a prefill engine hands a request off after its
first token and frees its KV; a decode engine takes it with its KV and computes only the token
it resumes from. Times by tests/engine/helpers.STEP:
t = 10 ms + 0.1 ms x prefill tokens + 1 ms x decoding sequences + 1 us x context tokens."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qlm.engine.engine_types import FirstToken, HandedOff
from qlm.engine.model.core import EngineModel
from qlm.types import InstanceRole
from tests.engine.helpers import engine, exact_instance, exact_profile, finishes, req, run_all


def prefill_engine() -> EngineModel:
    instance = replace(exact_instance(100_000), role=InstanceRole.PREFILL)
    return EngineModel(instance, [exact_profile()])


def test_a_prefill_engine_hands_off_after_the_first_token_and_frees_the_kv() -> None:
    model = prefill_engine()
    model.add(req("a", prompt=100, output=5), 0.0)
    events = run_all(model)
    assert [type(e) for e in events] == [FirstToken, HandedOff]
    handed = events[1]
    assert isinstance(handed, HandedOff)
    # prefill: 10 ms + 100 x 0.1 ms + 100 x 1 us = 20.1 ms; the prompt and its first token leave
    assert handed.at_s == pytest.approx(0.0201) == handed.first_token_at_s
    assert handed.kv_tokens == 101
    observed = model.observe(1e9)
    assert observed.requests == ()
    assert observed.kv_used_tokens == 0
    assert model.stats.handed_off == 1
    assert model.stats.finished == 0


def test_a_one_token_request_finishes_on_the_prefill_engine() -> None:
    model = prefill_engine()
    model.add(req("a", prompt=100, output=1), 0.0)
    events = run_all(model)
    assert set(finishes(events)) == {"a"}
    assert not any(isinstance(e, HandedOff) for e in events)


def test_a_decode_engine_goes_on_from_the_handed_off_token() -> None:
    """Same tokens as one engine; the decode side computes one token of prefill (the one it
    resumes from) instead of the prompt, and reports the first token's time from the
    prefill side."""
    handed = HandedOff("a", 0.0201, 0.0201, 101)
    decode = engine()
    decode.add(req("a", prompt=100, output=5), 0.05, received=handed)
    done = finishes(run_all(decode))["a"]
    alone = finishes(run_all(_one_engine()))["a"]
    assert done.output_tokens == alone.output_tokens == 5
    assert done.first_token_at_s == pytest.approx(0.0201)
    # one iteration with a 1-token chunk at 101 tokens of context, then three decode steps
    resume_s = 0.010 + 0.0001 + 0.000101
    decode_s = sum(0.010 + 0.001 + (102 + k) * 1e-6 for k in range(3))
    assert done.at_s == pytest.approx(0.05 + resume_s + decode_s)
    assert decode.stats.prefill_tokens == 1
    assert decode.stats.received == 1


def _one_engine() -> EngineModel:
    model = engine()
    model.add(req("a", prompt=100, output=5), 0.0)
    return model
