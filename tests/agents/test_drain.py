"""A loading engine's busy time (qlm/agents/drain.py): what is left of its load, a wake's when
the model woke from the standby tier, not always a cold load's."""

from __future__ import annotations

from dataclasses import replace

import pytest

from qlm.agents.drain import drain_estimate_s, load_left_s
from qlm.engine.types import EngineObservation, EngineState
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
