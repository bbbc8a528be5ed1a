"""Parrot's fork for a program's calls ready together (qlm/programs/fork.py): those that start
with the same text wait for the first of them."""

from __future__ import annotations

from qlm.prefixes.prompt_blocks import prompt_prefix
from qlm.programs.fork import leaders

PAPER = "A paper about queues. " * 40  # 880 characters: three whole 256-character blocks


def test_calls_that_start_with_the_same_text_wait_for_the_first() -> None:
    prefixes = {
        "s0": prompt_prefix(PAPER + "Summarise part 1.", 224),
        "s1": prompt_prefix(PAPER + "Summarise part 2.", 224),
        "s2": prompt_prefix(PAPER + "Summarise part 3.", 224),
        "other": prompt_prefix("Another text entirely. " * 20, 115),
        "short": prompt_prefix("Too short to share a block.", 6),
    }
    assert leaders(prefixes) == {"s1": "s0", "s2": "s0"}


def test_alone_or_with_nothing_shared_no_call_waits() -> None:
    assert leaders({"s0": prompt_prefix(PAPER, 220)}) == {}
    assert leaders({}) == {}


def test_a_short_shared_template_head_is_not_worth_a_wait() -> None:
    heads = {
        f"s{i}": prompt_prefix(f"Summarise: chunk {i} " * 30, 150, cuts=(len("Summarise: "),))
        for i in range(3)
    }
    assert all(h[0] == heads["s0"][0] for h in heads.values())  # the head block is shared
    assert leaders(heads) == {}
