"""Group coarsening: keep the MILP small by merging similar groups before solving.

Within one model and SLO class, groups are ordered by TTFT deadline and the adjacent pair with
the fewest requests together is merged, until the count fits the target. Pinned groups are
never merged. The plan is expanded back to the original groups afterwards (members of a merged
unit run consecutively, in deadline order)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from qlm.queue.group import RequestGroup


@dataclass(frozen=True)
class Coarsened:
    units: tuple[RequestGroup, ...]
    members: Mapping[str, tuple[str, ...]]  # unit id -> original group ids, in run order

    def expand(self, unit_ids: Sequence[str]) -> tuple[str, ...]:
        return tuple(gid for uid in unit_ids for gid in self.members[uid])


def coarsen(
    groups: Sequence[RequestGroup], target: int, keep: frozenset[str] = frozenset()
) -> Coarsened:
    """Merge groups until at most `target` remain (or nothing more can be merged)."""
    runs: dict[tuple[str, str], list[list[RequestGroup]]] = {}
    fixed: list[RequestGroup] = []
    for g in sorted(groups, key=lambda g: (g.ttft_deadline_at_s, g.first_arrival_at_s, g.id)):
        if g.id in keep:
            fixed.append(g)
        else:
            runs.setdefault((g.model, g.slo_class), []).append([g])
    count = len(fixed) + sum(len(r) for r in runs.values())
    while count > target and _merge_smallest_pair(runs):
        count -= 1
    units = [g for g in fixed]
    members: dict[str, tuple[str, ...]] = {g.id: (g.id,) for g in fixed}
    for parts_list in runs.values():
        for parts in parts_list:
            unit = parts[0] if len(parts) == 1 else RequestGroup.merged(
                "+".join(p.id for p in parts), parts
            )
            units.append(unit)
            members[unit.id] = tuple(p.id for p in parts)
    return Coarsened(tuple(units), members)


def _merge_smallest_pair(runs: dict[tuple[str, str], list[list[RequestGroup]]]) -> bool:
    best: tuple[int, tuple[str, str], int] | None = None
    for key, seq in runs.items():
        for i in range(len(seq) - 1):
            size = sum(g.size for g in seq[i]) + sum(g.size for g in seq[i + 1])
            if best is None or size < best[0]:
                best = (size, key, i)
    if best is None:
        return False
    _, key, i = best
    seq = runs[key]
    seq[i : i + 2] = [seq[i] + seq[i + 1]]
    return True
