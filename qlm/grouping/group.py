"""Request groups: the unit of planning (requests alike in model, SLO and token lengths)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from qlm.types import Request


@dataclass(frozen=True, slots=True)
class RequestGroup:
    """A set of queued requests planned together. Deadlines are the earliest of the members'."""

    id: str
    model: str
    slo_class: str
    request_ids: tuple[str, ...]
    prompt_tokens_mean: float
    output_cap_mean: float  # mean of the members' max_output_tokens
    ttft_deadline_at_s: float
    completion_deadline_at_s: float | None
    first_arrival_at_s: float

    def __post_init__(self) -> None:
        if not self.request_ids:
            raise ValueError(f"group {self.id}: a group needs at least one request")

    @property
    def size(self) -> int:
        return len(self.request_ids)

    @classmethod
    def of(cls, group_id: str, requests: Sequence[Request]) -> RequestGroup:
        """Summarise requests of one model into a group. The SLO class is the most common one
        among the members (ties: the one with the earliest deadline)."""
        if not requests:
            raise ValueError(f"group {group_id}: a group needs at least one request")
        models = {r.model for r in requests}
        if len(models) != 1:
            raise ValueError(f"group {group_id}: mixes models {sorted(models)}")
        n = len(requests)
        completion = [
            r.completion_deadline_at_s for r in requests if r.completion_deadline_at_s is not None
        ]
        return cls(
            id=group_id,
            model=requests[0].model,
            slo_class=_dominant_class(requests),
            request_ids=tuple(r.id for r in requests),
            prompt_tokens_mean=sum(r.prompt_tokens for r in requests) / n,
            output_cap_mean=sum(r.max_output_tokens for r in requests) / n,
            ttft_deadline_at_s=min(r.ttft_deadline_at_s for r in requests),
            completion_deadline_at_s=min(completion) if completion else None,
            first_arrival_at_s=min(r.arrival_at_s for r in requests),
        )

    @classmethod
    def merged(cls, group_id: str, parts: Sequence[RequestGroup]) -> RequestGroup:
        """One group standing for several of the same model (used by planner coarsening)."""
        if not parts:
            raise ValueError("merged() needs at least one group")
        if len({g.model for g in parts}) != 1:
            raise ValueError("merged() takes groups of one model")
        n = sum(g.size for g in parts)
        completion = [
            g.completion_deadline_at_s for g in parts if g.completion_deadline_at_s is not None
        ]
        urgent = min(parts, key=lambda g: g.ttft_deadline_at_s)
        return cls(
            id=group_id,
            model=parts[0].model,
            slo_class=urgent.slo_class,
            request_ids=tuple(rid for g in parts for rid in g.request_ids),
            prompt_tokens_mean=sum(g.prompt_tokens_mean * g.size for g in parts) / n,
            output_cap_mean=sum(g.output_cap_mean * g.size for g in parts) / n,
            ttft_deadline_at_s=urgent.ttft_deadline_at_s,
            completion_deadline_at_s=min(completion) if completion else None,
            first_arrival_at_s=min(g.first_arrival_at_s for g in parts),
        )


def _dominant_class(requests: Sequence[Request]) -> str:
    counts: dict[str, int] = {}
    earliest: dict[str, float] = {}
    for r in requests:
        counts[r.slo_class] = counts.get(r.slo_class, 0) + 1
        earliest[r.slo_class] = min(
            earliest.get(r.slo_class, r.ttft_deadline_at_s), r.ttft_deadline_at_s
        )
    return min(counts, key=lambda c: (-counts[c], earliest[c]))
