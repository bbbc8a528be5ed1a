"""Optional admission control by the plan's own prediction: refuse a request whose TTFT
deadline the latest published plan says it would miss (`ApiConfig.reject_unattainable_slo`,
off by default).

The estimate is deliberately simple and cheap. The control loop inserts a new arrival at the
end of the nearest planned group of its model and class, so a newcomer waits about as long as
the last member of such a group; the plan carries each member's predicted wait (the RWT
estimator's mean time to first token, measured from `waits_at_s`, the plan's last full
re-plan; plans derived since by inserting arrivals keep it). For every (model, class) the gate
keeps the earliest of those groups' predicted last first-token times:

    first_token_at_s(model, class) = waits_at_s + min over groups (max member wait)

and refuses a request when that time is later than its TTFT deadline. Without fresh waits
(no plan, or waits older than `plan_max_age_s`) or without a planned group of the request's
model and class, nothing is known and the request is admitted. The table is rebuilt only
when the plan's epoch changes, and the plan is re-read at most every `plan_refresh_s`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from qlm.api.errors import ApiError
from qlm.api.settings import ApiAppConfig
from qlm.clock import Clock
from qlm.control.plan import PublishedPlan
from qlm.queue.base import GlobalQueue
from qlm.types import Request

Key = tuple[str, str]  # (model, SLO class)
_NO_RETRY = {"x-should-retry": "false"}


def first_token_times(plan: PublishedPlan) -> Mapping[Key, float]:
    """(model, class) -> the earliest predicted first-token time of a newcomer."""
    table: dict[Key, float] = {}
    waits = plan.predicted_wait_s
    origin_s = _waits_origin_s(plan)
    for group in plan.groups.values():
        last_wait_s = plan.group_wait_s.get(group.group_id)  # plans cut for agents
        if last_wait_s is None:
            member_waits = [waits[rid] for rid in group.request_ids if rid in waits]
            if not member_waits:
                continue
            last_wait_s = max(member_waits)
        at_s = origin_s + last_wait_s
        key = (group.model, group.slo_class)
        table[key] = min(at_s, table.get(key, at_s))
    return MappingProxyType(table)


class SloGate:
    """Admission check against the latest plan (see the module docstring)."""

    def __init__(self, queue: GlobalQueue, settings: ApiAppConfig, clock: Clock) -> None:
        self._queue = queue
        self._clock = clock
        self._max_age_s = settings.api.plan_max_age_s
        self._refresh_s = settings.api.plan_refresh_s
        self._read_at_s = -float("inf")
        self._plan: PublishedPlan | None = None
        self._table: Mapping[Key, float] = MappingProxyType({})

    async def check(self, request: Request) -> None:
        """ApiError 429 when the plan predicts the request's first token after its deadline."""
        table = await self._current()
        first_token_at_s = table.get((request.model, request.slo_class))
        if first_token_at_s is None or first_token_at_s <= request.ttft_deadline_at_s:
            return
        wait_s = first_token_at_s - request.arrival_at_s
        raise ApiError(
            429,
            f"The latest plan predicts the first token of a {request.slo_class!r} request for "
            f"{request.model!r} in {wait_s:.1f} s, after its TTFT target of "
            f"{request.ttft_slo_s:.1f} s; retry later or choose a slower SLO class.",
            param="slo_class",
            code="slo_unattainable",
            headers=_NO_RETRY,
        )

    async def _current(self) -> Mapping[Key, float]:
        mono_s = self._clock.monotonic_s()
        if mono_s - self._read_at_s >= self._refresh_s:
            self._read_at_s = mono_s
            plan = await self._queue.current_plan()
            if plan is not None and (self._plan is None or plan.epoch != self._plan.epoch):
                self._table = first_token_times(plan)
            self._plan = plan
        plan = self._plan
        if plan is None or self._clock.now_s() - _waits_origin_s(plan) > self._max_age_s:
            return MappingProxyType({})
        return self._table


def _waits_origin_s(plan: PublishedPlan) -> float:
    return plan.created_at_s if plan.waits_at_s is None else plan.waits_at_s
