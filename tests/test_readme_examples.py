"""The README's example outputs are what the commands print (scripts/readme_examples.py
regenerates them): every marked block names a known example, and the deterministic ones match
a fresh run (summary.json holds no wall-clock figure: they go to timings.json)."""

from __future__ import annotations

import pytest

from scripts.readme_examples import EXAMPLES, README, blocks


def test_every_marked_block_is_a_known_example_and_every_example_is_shown() -> None:
    shown = blocks(README.read_text())
    assert set(shown) == set(EXAMPLES)
    assert all(body.strip() for body in shown.values())


@pytest.mark.slow
def test_the_simulate_summary_is_what_the_command_writes() -> None:
    shown = blocks(README.read_text())["simulate-summary"]
    fresh = EXAMPLES["simulate-summary"].make()
    assert shown == fresh
