"""The README's example outputs are what the commands print (scripts/readme_examples.py
regenerates them): every marked block names a known example, and the deterministic ones match
a fresh run (sim_wall_s, a wall-clock time, aside)."""

from __future__ import annotations

import json

import pytest

from scripts.readme_examples import EXAMPLES, README, blocks


def without_wall_time(text: str) -> object:
    doc = json.loads(text)
    for entry in doc["policies"].values():
        entry.pop("sim_wall_s")
    return doc


def test_every_marked_block_is_a_known_example_and_every_example_is_shown() -> None:
    shown = blocks(README.read_text())
    assert set(shown) == set(EXAMPLES)
    assert all(body.strip() for body in shown.values())


@pytest.mark.slow
def test_the_simulate_summary_is_what_the_command_writes() -> None:
    shown = blocks(README.read_text())["simulate-summary"]
    fresh = EXAMPLES["simulate-summary"].make()
    assert without_wall_time(shown) == without_wall_time(fresh)
