"""Pacing: work with a far deadline runs at the pace its deadline needs, not at once, so that
engines keep room for latency-bound requests.

A class marked `paced` (SloClassConfig.paced: batch jobs, offline work) promises a deadline,
not a latency. Run work-conserving, a 2,000-request job fills every engine the moment it is
submitted, and interactive requests that arrive meanwhile wait behind it, though the job
had hours to spare. Paced, each of its requests starts no earlier than it must for the job to
end by a deadline compressed by `factor` (`QlmConfig.control.pacing_factor`, 2: by half its
window, measured from each request's arrival: the pace is steady and the second half of the
window stays a margin for what the estimates miss).

`held_back` computes, over the schedule's kept requests in due order (the pool seen as one
machine, qlm/agents/dispatch.py), the latest start of each (as late as possible: it must be
done by its due time, compressed for paced classes, and before the next one's latest
start); a paced request whose latest start is still ahead is held back. Requests of other
classes are never held back, but their work counts: a paced request due before a burst of
them starts early enough to leave them room. Requests the schedule did not check (past its
window) follow the last checked one (their work, at the checked ones' mean cost, counted
before it) and are held back when it is; so do the paced requests a live agent is not shown
(`unseen`: the plan's `queued_counts` less what it shows).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from qlm.agents.queued import QueuedItem
from qlm.config import QlmConfig


@dataclass(frozen=True, slots=True)
class Pacing:
    classes: frozenset[str]
    factor: float = 2.0

    @classmethod
    def of(cls, config: QlmConfig) -> Pacing | None:
        """The configuration's pacing; None when no class is paced (nothing is held back)."""
        classes = frozenset(c.name for c in config.slo_classes if c.paced)
        return cls(classes, config.control.pacing_factor) if classes else None


def held_back(
    kept: Sequence[QueuedItem],
    due_and_cost: Mapping[str, tuple[float, float]],
    pacing: Pacing,
    now_s: float,
    unseen: int = 0,
) -> tuple[frozenset[str], float]:
    """Over a schedule's kept requests (`Schedule.kept`, `Schedule.due_and_cost`): those of
    paced classes not due to start yet, and when the first of them is (inf: none). `unseen`
    paced requests queued but not in `kept` (past what a live agent is shown) count like
    the unchecked ones."""
    held: set[str] = set()
    wake_at_s = math.inf
    unchecked = [it for it in kept if it.request_id not in due_and_cost]
    costs = [cost_s for _, cost_s in due_and_cost.values()]
    # The unchecked follow the last checked one (due no sooner): their work, at the checked
    # requests' mean cost, must fit between it and its due time.
    rest = len(unchecked) + unseen
    rest_work_s = rest * sum(costs) / len(costs) if rest and costs else 0.0
    next_start_s = math.inf
    last_held = False
    for item in reversed(kept):
        known = due_and_cost.get(item.request_id)
        if known is None:
            continue
        due_s, cost_s = known
        paced = item.slo_class in pacing.classes
        if paced:
            due_s = _compressed_s(due_s, item.arrival_at_s, pacing.factor, now_s)
        last = next_start_s == math.inf
        if last:
            next_start_s = due_s - rest_work_s
        start_s = min(due_s, next_start_s) - cost_s
        next_start_s = start_s
        if paced and start_s > now_s:
            held.add(item.request_id)
            wake_at_s = min(wake_at_s, start_s)
            last_held = last_held or last
    if last_held:
        held.update(it.request_id for it in unchecked if it.slo_class in pacing.classes)
    return frozenset(held), wake_at_s


def _compressed_s(due_s: float, arrival_s: float, factor: float, now_s: float) -> float:
    """The due time pacing aims for: `factor` times sooner from the request's arrival (from
    now when its arrival is unknown), never before now."""
    start_s = arrival_s if arrival_s > -math.inf else now_s
    return max(now_s, start_s + (due_s - start_s) / factor)


def unheld(
    is_queued: Callable[[str], bool],
    kept: Sequence[QueuedItem],
    due_and_cost: Mapping[str, tuple[float, float]],
    pacing: Pacing | None,
    now_s: float,
    unseen: int = 0,
) -> tuple[Callable[[str], bool], float]:
    """`is_queued` less the requests pacing holds back now, and when the first of them is
    due to start (inf: none held)."""
    if pacing is None:
        return is_queued, math.inf
    held, wake_at_s = held_back(kept, due_and_cost, pacing, now_s, unseen)
    if not held:
        return is_queued, wake_at_s
    return (lambda request_id: request_id not in held and is_queued(request_id)), wake_at_s


def first_compressed_s(
    kept: Sequence[QueuedItem], due_and_cost: Mapping[str, tuple[float, float]], pacing: Pacing
) -> float:
    """The earliest compressed due time of the checked paced requests (before it, `now_s`
    changes none of them; -inf when one's arrival is unknown: its due time moves with now)."""
    first_s = math.inf
    for item in kept:
        known = due_and_cost.get(item.request_id)
        if known is not None and item.slo_class in pacing.classes:
            if item.arrival_at_s == -math.inf:
                return -math.inf
            start_s = item.arrival_at_s
            first_s = min(first_s, start_s + (known[0] - start_s) / pacing.factor)
    return first_s
