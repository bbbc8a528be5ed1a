"""Group coarsening: keep the MILP small by merging groups before solving.

Only groups that the start plan (EDF improved by local search, `MilpPlanner`) runs back to back
on the same instance, with the same model and SLO class, are merged (so a unit's lateness weight
is its members'), the pair with the fewest requests together first, until the count fits the
target; only if that is not enough, pairs of different classes are merged too. The start plan
is therefore expressible over the merged units, and it is the MILP's warm start, so coarsening
never costs the MILP its starting point. Pinned groups are never merged. Plans are expanded back
to the original groups (a unit's members run consecutively, in their start-plan order)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from qlm.grouping.group import RequestGroup


@dataclass(frozen=True)
class Coarsened:
    units: tuple[RequestGroup, ...]
    members: Mapping[str, tuple[str, ...]]  # unit id -> original group ids, in run order
    start_units: tuple[tuple[str, ...], ...]  # the start plan's queues over units, per instance

    def expand(self, unit_ids: Sequence[str]) -> tuple[str, ...]:
        return tuple(gid for uid in unit_ids for gid in self.members[uid])


def coarsen(
    start_queues: Sequence[Sequence[RequestGroup]],
    target: int,
    keep: frozenset[str] = frozenset(),
) -> Coarsened:
    """Merge adjacent groups of one model in the start plan until at most `target` remain."""
    queues = [[[g] for g in queue] for queue in start_queues]
    count = sum(len(q) for q in queues)
    for same_class in (True, False):  # like with like first; then across classes if needed
        while count > target and _merge_smallest_pair(queues, keep, same_class):
            count -= 1
    members: dict[str, tuple[str, ...]] = {}
    units: list[RequestGroup] = []
    start_units: list[tuple[str, ...]] = []
    for queue in queues:
        ids = []
        for parts in queue:
            unit = parts[0] if len(parts) == 1 else RequestGroup.merged(_unit_id(parts), parts)
            units.append(unit)
            members[unit.id] = tuple(p.id for p in parts)
            ids.append(unit.id)
        start_units.append(tuple(ids))
    return Coarsened(tuple(units), members, tuple(start_units))


def _unit_id(parts: Sequence[RequestGroup]) -> str:
    return f"{parts[0].id}+{len(parts) - 1}"


def _mergeable(
    a: list[RequestGroup], b: list[RequestGroup], keep: frozenset[str], same_class: bool
) -> bool:
    if a[0].model != b[0].model or (same_class and a[0].slo_class != b[0].slo_class):
        return False
    return not any(g.id in keep for g in (*a, *b))


def _merge_smallest_pair(
    queues: list[list[list[RequestGroup]]], keep: frozenset[str], same_class: bool
) -> bool:
    best: tuple[int, int, int] | None = None
    for q, queue in enumerate(queues):
        for i in range(len(queue) - 1):
            if not _mergeable(queue[i], queue[i + 1], keep, same_class):
                continue
            size = sum(g.size for g in queue[i]) + sum(g.size for g in queue[i + 1])
            if best is None or size < best[0]:
                best = (size, q, i)
    if best is None:
        return False
    _, q, i = best
    queues[q][i : i + 2] = [queues[q][i] + queues[q][i + 1]]
    return True
