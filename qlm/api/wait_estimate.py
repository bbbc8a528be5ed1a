"""Every admitted request's predicted wait and completion, and the optional admission check
built on it (`ApiConfig.reject_unattainable_slo`, off by default).

Where the API knows the fleet (`qlm serve`, `qlm demo`), the wait is the dispatch decision's
forecast (qlm/api/wait_forecast.py): the function the simulator grades, with basis

* `schedule`: the request's first token as its model's dispatch schedule places it; its
  completion adds its own output at the pace below (`plan` basis). It comes with a bound the
  first token should meet nine times in ten (`x-qlm-estimated-wait-p90-s`):
  the forecast times the conformal quantile of how many times later than forecast the class's
  recent forecasts came
  (qlm/estimator/forecast_band.py), once the API has seen enough of them finish;
* `late`: the schedule drops it, a predicted miss: the wait is the later of its TTFT target
  and the plan's estimate below.

Without a forecast (no instance reported serving its model, the API started without the
fleet, or the request past its class's scheduling window) the estimate is the plan's, read
from the latest published plan.

The plan's estimate is deliberately simple and cheap. The control loop inserts a new arrival
at the end of the nearest planned group of its model and class, so a newcomer waits about as long as
the last member of such a group; the plan carries each member's predicted wait (the RWT
estimator's mean time to first token, measured from `waits_at_s`, the plan's last full
re-plan; plans derived since by inserting arrivals keep it). For every (model, class) the
table keeps the earliest of those groups' predicted last first-token times:

    first_token_at_s(model, class) = waits_at_s + min over groups (max member wait)

A request's estimate is that time minus its arrival (never below 0), with a `basis`:

* `plan`: a planned group of its model and class exists (the number above); its predicted
  completion adds its own output at that group's decode step (`group_step_s`): all of
  `max_tokens` under `ignore_eos`, else the model's mean output capped by `max_tokens`
  (plans without those figures: the group's predicted completion of its last member,
  `group_done_s`);
* `idle`: the plan is fresh but holds no group of its model and class, so nothing of its
  kind waits ahead of it: the next control round places it, and it takes what it takes alone
  on the fleet's fastest live instance for its model, preferring one that holds it
  (`PublishedPlan.forecast.lone`): the model's load if none holds it, its prefill to the
  first token, then its output (`max_tokens` with `ignore_eos`, else the profile's mean
  output capped by `max_tokens`) at the batch-1 decode step; 0 s and no completion when the
  plan knows no instance for its model;
* `no-plan`: no plan, or its waits are older than `plan_max_age_s`: 0 s, nothing is known.

A `no-plan` estimate has no completion: nothing is known.

The gate refuses a request on a `schedule` or `plan` estimate whose first token comes after
its TTFT deadline, and on a `late` one. The table is rebuilt only when the plan's epoch
changes, and the plan is re-read at most every `plan_refresh_s`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from qlm.agents.decision import Forecast
from qlm.api.errors import ApiError
from qlm.api.wait_forecast import QueueForecaster
from qlm.clock import Clock
from qlm.config.api_settings import ApiAppConfig
from qlm.control.plan import LoneSpeed, PublishedPlan
from qlm.queue.queue_protocol import GlobalQueue
from qlm.types import Request

Key = tuple[str, str]  # (model, SLO class)
Basis = Literal["schedule", "late", "plan", "idle", "no-plan"]
# The bases of an estimate that knows something (a `no-plan` one knows nothing).
KNOWN: tuple[Basis, ...] = ("schedule", "late", "plan", "idle")
WAIT_HEADER = "x-qlm-estimated-wait-s"
BOUND_HEADER = "x-qlm-estimated-wait-p90-s"
COMPLETION_HEADER = "x-qlm-estimated-completion-s"
BASIS_HEADER = "x-qlm-estimate-basis"


@dataclass(frozen=True, slots=True)
class WaitEstimate:
    """Seconds from a request's arrival to its predicted first token and to the predicted end
    of its output (None: unknown), and what they rest on."""

    wait_s: float
    basis: Basis
    completion_s: float | None = None
    wait_p90_s: float | None = None  # a `schedule` wait's bound for nine in ten

    @classmethod
    def of(cls, request: Request) -> WaitEstimate:
        """The estimate an admitted request carries."""
        basis = next((b for b in KNOWN if b == request.estimate_basis), None)
        if request.estimated_wait_s is None or basis is None:
            return cls(0.0, "no-plan")
        return cls(
            request.estimated_wait_s,
            basis,
            request.estimated_completion_s,
            request.estimated_wait_p90_s,
        )

    def headers(self) -> dict[str, str]:
        out = {WAIT_HEADER: f"{self.wait_s:.3f}", BASIS_HEADER: self.basis}
        if self.completion_s is not None:
            out[COMPLETION_HEADER] = f"{self.completion_s:.3f}"
        if self.wait_p90_s is not None:
            out[BOUND_HEADER] = f"{self.wait_p90_s:.3f}"
        return out


@dataclass(frozen=True, slots=True)
class _Times:
    """A newcomer's predicted first-token and completion times (absolute seconds)."""

    first_token_at_s: float
    done_at_s: float | None  # the group's last member's (mean output)
    step_s: float | None = None  # the group's decode step


def newcomer_times(plan: PublishedPlan) -> Mapping[Key, _Times]:
    """(model, class) -> a newcomer's times in the group whose last member gets its first
    token earliest."""
    table: dict[Key, _Times] = {}
    forecast = plan.forecast
    waits = forecast.predicted_wait_s
    origin_s = _waits_origin_s(plan)
    for group in plan.groups.values():
        last_wait_s = forecast.group_wait_s.get(group.group_id)  # plans cut for agents
        if last_wait_s is None:
            member_waits = [waits[rid] for rid in group.request_ids if rid in waits]
            if not member_waits:
                continue
            last_wait_s = max(member_waits)
        at_s = origin_s + last_wait_s
        key = (group.model, group.slo_class)
        if key not in table or at_s < table[key].first_token_at_s:
            done_s = forecast.group_done_s.get(group.group_id)
            step_s = forecast.group_step_s.get(group.group_id)
            table[key] = _Times(at_s, None if done_s is None else origin_s + done_s, step_s)
    return MappingProxyType(table)


class WaitEstimator:
    """Estimates from the dispatch forecast where there is one, else from the latest plan
    (see the module docstring)."""

    def __init__(
        self,
        queue: GlobalQueue,
        settings: ApiAppConfig,
        clock: Clock,
        forecaster: QueueForecaster | None = None,
    ) -> None:
        self._queue = queue
        self._clock = clock
        self._max_age_s = settings.api.plan_max_age_s
        self._refresh_s = settings.api.plan_refresh_s
        self._read_at_s = -math.inf
        self._plan: PublishedPlan | None = None
        self._table: Mapping[Key, _Times] = MappingProxyType({})
        self._lone: Mapping[str, LoneSpeed] = MappingProxyType({})
        self.forecaster = forecaster

    async def estimate(self, request: Request) -> WaitEstimate:
        planned = await self._planned(request)
        forecast = None if self.forecaster is None else await self.forecaster.forecast(request)
        return planned if forecast is None else self._scheduled(request, forecast, planned)

    def forget(self, request: Request) -> None:
        """An estimated request that was not admitted after all."""
        if self.forecaster is not None:
            self.forecaster.forget(request.id)

    def _scheduled(
        self, request: Request, forecast: Forecast, planned: WaitEstimate
    ) -> WaitEstimate:
        """A `schedule` or `late` estimate; its completion adds its own output at the pace
        the plan's estimate assumed."""
        first_s = forecast.first_token_s
        if first_s is None:
            return WaitEstimate(max(request.ttft_slo_s, planned.wait_s), "late")
        wait_s = max(0.0, first_s)
        assert self.forecaster is not None
        bound_s = self.forecaster.bound_s(request.id)
        if planned.completion_s is None:
            return WaitEstimate(wait_s, "schedule", None, bound_s)
        own_s = max(0.0, planned.completion_s - planned.wait_s)
        return WaitEstimate(wait_s, "schedule", wait_s + own_s, bound_s)

    async def _planned(self, request: Request) -> WaitEstimate:
        """The plan's estimate (`plan`, `idle` or `no-plan`)."""
        table = await self._current()
        if table is None:
            return WaitEstimate(0.0, "no-plan")
        times = table.get((request.model, request.slo_class))
        if times is None:
            return _alone(request, self._lone.get(request.model))
        wait_s = max(0.0, times.first_token_at_s - request.arrival_at_s)
        lone = self._lone.get(request.model)
        if times.step_s is not None and lone is not None:  # its own output at the group's pace
            own_s = _output_tokens(request, lone) * times.step_s
            return WaitEstimate(wait_s, "plan", wait_s + own_s)
        if times.done_at_s is None:
            return WaitEstimate(wait_s, "plan")
        return WaitEstimate(wait_s, "plan", max(wait_s, times.done_at_s - request.arrival_at_s))

    async def _current(self) -> Mapping[Key, _Times] | None:
        """The table of a fresh plan; None without one."""
        mono_s = self._clock.monotonic_s()
        if mono_s - self._read_at_s >= self._refresh_s:
            self._read_at_s = mono_s
            plan = await self._queue.current_plan()
            if plan is not None and (self._plan is None or plan.epoch != self._plan.epoch):
                self._table = newcomer_times(plan)
                self._lone = plan.forecast.lone
            self._plan = plan
        plan = self._plan
        if plan is None or self._clock.now_s() - _waits_origin_s(plan) > self._max_age_s:
            return None
        return self._table


def _alone(request: Request, lone: LoneSpeed | None) -> WaitEstimate:
    """An `idle` estimate: the request served alone at `lone`'s speed (unknown: 0 s)."""
    if lone is None:
        return WaitEstimate(0.0, "idle")
    return WaitEstimate(
        lone.first_token_s(request.prompt_tokens),
        "idle",
        lone.completion_s(request.prompt_tokens, _output_tokens(request, lone)),
    )


def _output_tokens(request: Request, lone: LoneSpeed) -> float:
    """The tokens a request is expected to generate: all of max_tokens under ignore_eos,
    else the model's mean output (its profile's) capped by max_tokens."""
    if request.ignores_eos:
        return float(request.max_output_tokens)
    return min(float(request.max_output_tokens), lone.output_tokens_mean)


def refuse_unattainable(request: Request, estimate: WaitEstimate) -> None:
    """ApiError 429 when the estimate puts the request's first token after its deadline (a
    `schedule` or `plan` estimate past it, or a `late` one); Retry-After is how long until
    the predicted wait would fit its TTFT target."""
    late = estimate.basis == "late"
    past = estimate.basis in ("schedule", "plan") and estimate.wait_s > request.ttft_slo_s
    if not (late or past):
        return
    when = "too late to keep" if late else f"in {estimate.wait_s:.1f} s, after"
    raise ApiError(
        429,
        f"QLM predicts the first token of a {request.slo_class!r} request for "
        f"{request.model!r} {when} its TTFT target of {request.ttft_slo_s:.1f} s; "
        "retry later or choose a slower SLO class.",
        param="slo_class",
        code="slo_unattainable",
        headers={
            "x-should-retry": "false",  # the official client would retry at once otherwise
            "retry-after": str(max(1, math.ceil(estimate.wait_s - request.ttft_slo_s))),
            **estimate.headers(),
        },
    )


def _waits_origin_s(plan: PublishedPlan) -> float:
    waits_at_s = plan.forecast.waits_at_s
    return plan.created_at_s if waits_at_s is None else waits_at_s
