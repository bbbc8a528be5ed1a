"""Preble's local order, shared by the engine model and the native engine.

Question answered: in which order are waiting requests admitted so that those whose prompts
the prefix cache mostly holds go first, yet those it does not hold are not starved? Each item
goes to priority group floor(P x hit share) of P + 1 (hit share: the part of its prompt the
cache holds now, in [0, 1]); in each round group g gives up to g + 1 items, highest group
first, each group in the order given (arrival order).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def by_priority_groups(
    items: Sequence[T], hits: Callable[[T], tuple[int, int]], groups: int
) -> list[T]:
    """`items` in Preble's order over `groups` (P) priority groups (module docstring);
    `hits` gives an item's (cached tokens, prompt tokens)."""
    members: list[list[T]] = [[] for _ in range(groups + 1)]
    for item in items:
        cached, prompt = hits(item)
        members[min(groups * cached // max(prompt, 1), groups)].append(item)
    order: list[T] = []
    taken = [0] * len(members)
    while len(order) < len(items):
        for g in range(groups, -1, -1):
            share_of_round = members[g][taken[g] : taken[g] + g + 1]
            taken[g] += len(share_of_round)
            order.extend(share_of_round)
    return order
