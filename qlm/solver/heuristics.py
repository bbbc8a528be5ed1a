"""List-scheduling heuristics over the cost table: EDF (the MILP's warm start and fallback)
and FCFS (vLLM-like). Both place pinned groups first, then one group at a time."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from qlm.solver.costs import CostTable

Queues = list[list[int]]


@dataclass(slots=True)
class _QueueState:
    start_s: float
    model: str | None
    groups: list[int]


def _initial(table: CostTable) -> list[_QueueState]:
    states = [
        _QueueState(table.base_s[q], inst.loaded_model, [])
        for q, inst in enumerate(table.instances)
    ]
    for q, gs in table.pinned.items():
        for g in gs:
            _append(table, states[q], g, q)
    return states


def _append(table: CostTable, state: _QueueState, g: int, q: int) -> None:
    model = table.groups[g].model
    if model != state.model:
        state.start_s += table.swap_s[(model, q)]
        state.model = model
    state.start_s += table.costs[(g, q)].occupancy_s
    state.groups.append(g)


def _ttft_if_appended(table: CostTable, state: _QueueState, g: int, q: int) -> float:
    model = table.groups[g].model
    swap = table.swap_s[(model, q)] if model != state.model else 0.0
    return state.start_s + swap + table.costs[(g, q)].ttft_lag_s


def _unpinned(table: CostTable) -> list[int]:
    pinned = {g for gs in table.pinned.values() for g in gs}
    return [g for g in range(table.num_groups) if g not in pinned]


Chooser = Callable[[CostTable, Sequence[_QueueState], int], int]


def _list_schedule(table: CostTable, order: Sequence[int], choose: Chooser) -> Queues:
    states = _initial(table)
    for g in order:
        q = choose(table, states, g)
        _append(table, states[q], g, q)
    return [s.groups for s in states]


def _earliest_ttft(table: CostTable, states: Sequence[_QueueState], g: int) -> int:
    """The compatible instance where the group's TTFT is earliest; at a tie, one that
    displaces no model (idle, or on the group's model) before one whose model it unloads."""
    model = table.groups[g].model

    def key(q: int) -> tuple[float, bool, int]:
        held = states[q].model
        return (_ttft_if_appended(table, states[q], g, q), held not in (None, model), q)

    return min(table.compatible(g), key=key)


def _least_loaded_same_model(table: CostTable, states: Sequence[_QueueState], g: int) -> int:
    candidates = table.compatible(g)
    same = [q for q in candidates if states[q].model == table.groups[g].model]
    return min(same or candidates, key=lambda q: (states[q].start_s, q))


def edf_queues(table: CostTable) -> Queues:
    """Global earliest-deadline-first: groups by TTFT deadline, each to the instance where its
    TTFT would be earliest (swap cost included)."""
    order = sorted(
        _unpinned(table),
        key=lambda g: (table.deadline_s[g], table.groups[g].first_arrival_at_s, g),
    )
    return _list_schedule(table, order, _earliest_ttft)


def fcfs_queues(table: CostTable) -> Queues:
    """vLLM-like: groups in arrival order to the least-loaded instance that already has the
    model (static placement); any compatible instance only when none has it."""
    order = sorted(_unpinned(table), key=lambda g: (table.groups[g].first_arrival_at_s, g))
    return _list_schedule(table, order, _least_loaded_same_model)
