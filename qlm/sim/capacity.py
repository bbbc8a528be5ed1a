"""Capacity planning: the cheapest fleet (instances per GPU type) that meets a target SLO
attainment under a policy.

The search assumes attainment never drops when an instance is added (a monotone frontier) and
uses it to evaluate few fleets: with the GPU types ordered from the most to the least expensive
instance, it fixes the counts of all but the last two, walks the staircase frontier of the last
two (for each count of the dearer one, the least count of the cheaper one that meets the target,
which can only fall as the dearer count grows), and skips every fleet that cannot beat the
cheapest one found so far. The answer is the cheapest *evaluated* fleet that meets the target, so
it is always a fleet that was simulated; where noise breaks monotonicity the search may miss a
cheaper fleet, never report one that fails.

The walk is sequential (each fleet is picked from the answers before it), but a caller with
many workers can give a `prefetch` hook: before it searches a column the search names every
fleet of that column it may ask for, so the caller can simulate them at once and answer the
later `attainment` calls from what it computed. The search still asks, and records, exactly
the fleets it asks for without the hook, so the result is the same either way; the column's
other fleets are extra work, done in parallel.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Counts = tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Evaluation:
    counts: Mapping[str, int]
    cost_per_hour: float
    attainment: float
    meets: bool

    def as_dict(self) -> dict[str, Any]:
        return {
            "counts": dict(self.counts),
            "cost_per_hour": self.cost_per_hour,
            "attainment": self.attainment,
            "meets": self.meets,
        }


@dataclass(frozen=True)
class CapacityResult:
    gpu_types: tuple[str, ...]
    target: float
    evaluations: tuple[Evaluation, ...]  # in the order they were run
    best: Evaluation | None  # the cheapest evaluated fleet that meets the target

    def as_dict(self) -> dict[str, Any]:
        return {
            "gpu_types": list(self.gpu_types),
            "target": self.target,
            "evaluated": [e.as_dict() for e in self.evaluations],
            "best": None if self.best is None else self.best.as_dict(),
        }


@dataclass(frozen=True)
class SearchSpace:
    """Counts 0..max_count of each GPU type; cost(counts) must grow with every count."""

    gpu_types: tuple[str, ...]
    max_count: int
    cost: Callable[[Mapping[str, int]], float]

    def __post_init__(self) -> None:
        if not self.gpu_types:
            raise ValueError("capacity search needs at least one GPU type")
        if self.max_count < 1:
            raise ValueError("max_count must be >= 1")


Attainment = Callable[[Mapping[str, int]], float]
Prefetch = Callable[[Sequence[Mapping[str, int]]], None]


class _Search:
    def __init__(
        self,
        space: SearchSpace,
        attainment: Attainment,
        target: float,
        prefetch: Prefetch | None = None,
    ) -> None:
        unit = {g: space.cost({t: int(t == g) for t in space.gpu_types}) for g in space.gpu_types}
        # dearest first: the outer loops stop soonest on the cost bound
        self.order = tuple(sorted(space.gpu_types, key=lambda g: (-unit[g], g)))
        self.space = space
        self.attainment = attainment
        self.target = target
        self.prefetch = prefetch
        self.seen: dict[Counts, Evaluation] = {}
        self.log: list[Evaluation] = []
        self.best_cost = float("inf")

    def counts(self, values: Counts) -> dict[str, int]:
        return dict(zip(self.order, values, strict=True))

    def cost(self, values: Counts) -> float:
        return self.space.cost(self.counts(values))

    def meets(self, values: Counts) -> bool:
        """Simulate (once per fleet) and record."""
        if not any(values):
            return False
        found = self.seen.get(values)
        if found is None:
            counts = self.counts(values)
            value = self.attainment(counts)
            found = Evaluation(counts, self.cost(values), value, value >= self.target)
            self.seen[values] = found
            self.log.append(found)
            if found.meets:
                self.best_cost = min(self.best_cost, found.cost_per_hour)
        return found.meets

    def run(self) -> None:
        n = len(self.order)
        if n == 1:
            self.column((), None)
            return
        for prefix in itertools.product(range(self.space.max_count + 1), repeat=n - 2):
            if self.cost((*prefix, 0, 0)) >= self.best_cost:
                continue
            self.staircase(prefix)

    def affordable_max(self, prefix: Counts, upper: int) -> int:
        """The largest last count <= upper whose fleet costs less than the best so far."""
        while upper >= 0 and self.cost((*prefix, upper)) >= self.best_cost:
            upper -= 1
        return upper

    def column(self, prefix: Counts, known_meets: int | None) -> int | None:
        """The least last count that meets the target given prefix (None if none affordable).
        known_meets: a count already known (by monotonicity) to meet the target."""
        top = self.space.max_count if known_meets is None else known_meets
        hi = self.affordable_max(prefix, top)
        if self.prefetch is not None:  # every fleet of the column this call may ask for
            wanted = [(*prefix, c) for c in range(hi + 1)]
            fresh = [v for v in wanted if any(v) and v not in self.seen]
            if fresh:
                self.prefetch([self.counts(v) for v in fresh])
        if hi < 0 or (hi != known_meets and not self.meets((*prefix, hi))):
            return None
        lo = 0  # hi meets; find the least in [lo, hi]
        if known_meets is not None:  # the frontier moves little: walk down from hi
            while hi > 0 and self.meets((*prefix, hi - 1)):
                hi -= 1
            return hi
        while lo < hi:
            mid = (lo + hi) // 2
            if self.meets((*prefix, mid)):
                hi = mid
            else:
                lo = mid + 1
        return hi

    def staircase(self, prefix: Counts) -> None:
        known: int | None = None
        for outer in range(self.space.max_count + 1):
            if self.cost((*prefix, outer, 0)) >= self.best_cost:
                return
            least = self.column((*prefix, outer), known)
            if least is not None:
                known = least


def cheapest_fleet(
    space: SearchSpace, attainment: Attainment, target: float, prefetch: Prefetch | None = None
) -> CapacityResult:
    """Search counts per GPU type for the cheapest fleet whose attainment is >= target;
    `prefetch` (optional) is told the fleets a column may need before it is searched."""
    if not 0.0 < target <= 1.0:
        raise ValueError("target must be in (0, 1]")
    search = _Search(space, attainment, target, prefetch)
    search.run()
    winners = [e for e in search.log if e.meets]
    best = min(
        winners,
        key=lambda e: (e.cost_per_hour, sum(e.counts.values()), tuple(e.counts.values())),
        default=None,
    )
    return CapacityResult(space.gpu_types, target, tuple(search.log), best)


def parse_costs(text: str | None, known: Sequence[str]) -> dict[str, float]:
    """'A10=1.0,A100=3.7' -> {'A10': 1.0, 'A100': 3.7}."""
    out: dict[str, float] = {}
    if not text:
        return out
    for part in text.split(","):
        name, sep, value = part.partition("=")
        name = name.strip()
        if not sep or name not in known:
            raise ValueError(f"--cost: expected GPU=COST with GPU in {list(known)}, got {part!r}")
        cost = float(value)
        if cost < 0:
            raise ValueError(f"--cost: {name} cost must be >= 0")
        out[name] = cost
    return out
