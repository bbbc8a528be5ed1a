"""The one object the live processes call when something worth counting happens: `PlaneMetrics`,
the Prometheus implementation of the hooks they call (`MetricsHooks`, hooks.py).

    metrics = PlaneMetrics(CollectorRegistry(), clock, slo_classes=..., models=...)
    metrics.request_admitted(request)             # api
    metrics.request_finished(request, result)     # agent (attainment, TTFT, end to end)
    metrics.queue_snapshot(queued, plan)          # control loop, every round

Hooks are one-liners in the API, the agents and the control loop; without a recorder they get
NO_METRICS, whose methods do nothing, so tests and the simulator pay nothing. Label values are
clamped to the configured classes and models ("other" otherwise), so a client cannot grow the
number of series by inventing names.
"""

from __future__ import annotations

import math
from collections import Counter as Tally
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry

from qlm.causes.live import LIVE_CAUSES, result_cause
from qlm.clock import Clock
from qlm.config import QlmConfig
from qlm.config.metrics_settings import MetricsConfig
from qlm.control.plan import PlannedGroup, PublishedPlan
from qlm.engine.engine_types import EngineState
from qlm.metrics.families import (
    EVICTION_KINDS,
    PLAN_FAILED,
    REQUEST_OUTCOMES,
    Families,
    PrefixTallies,
)
from qlm.metrics.history import History
from qlm.metrics.hooks import PlaneEvent, met_slo
from qlm.queue.records import InstanceStatus, RequestResult
from qlm.solver.plan_types import Plan, PlanStatus
from qlm.types import Request, RequestState

OTHER = "other"  # label value for a class or model outside the configuration
NO_MODEL = "none"
_OUTCOME = {
    RequestState.COMPLETED: "completed",
    RequestState.CANCELLED: "cancelled",
    RequestState.FAILED: "failed",
}
_MAX_PREDICTIONS = 100_000  # predicted first-token times kept for pairing with actual ones


class PlaneMetrics:
    """Records a control plane's events on its own registry. One per process (`qlm serve`
    shares it between API, control loop and agents)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        clock: Clock,
        *,
        slo_classes: Sequence[str],
        models: Sequence[str],
        instances: Sequence[str] = (),
        planner_policy: str = "",
        settings: MetricsConfig | None = None,
    ) -> None:
        self.registry = registry
        self.clock = clock
        self.settings = settings or MetricsConfig()
        self.families = Families.on(registry)
        self.slo_classes = tuple(slo_classes)
        self.models = tuple(models)
        self.events: deque[PlaneEvent] = deque(maxlen=self.settings.recent_events)
        self.history = History(self.settings.history_s, self.settings.sample_every_s)
        self._classes = frozenset(slo_classes)
        self._models = frozenset(models)
        self._policy = planner_policy
        self._predicted_at_s: OrderedDict[str, float] = OrderedDict()
        # instance id -> (model it had, model a started swap loads)
        self._swapping: dict[str, tuple[str, str]] = {}
        self._instance_model: dict[str, str] = {}
        self._prefix_tallies = PrefixTallies()
        self._leading = False
        self._snapshot_at_s = -math.inf
        self._initialise(instances)

    @classmethod
    def for_plane(
        cls,
        config: QlmConfig,
        clock: Clock,
        *,
        models: Sequence[str],
        instances: Sequence[str] = (),
        settings: MetricsConfig | None = None,
    ) -> PlaneMetrics:
        """A recorder on a fresh registry for a plane configured by `config`."""
        return cls(
            CollectorRegistry(),
            clock,
            slo_classes=[c.name for c in config.slo_classes],
            models=models,
            instances=instances,
            planner_policy=config.planner.policy,
            settings=settings,
        )

    def _initialise(self, instances: Sequence[str]) -> None:
        """Create every series the configuration implies, at zero, so that rate() and
        absent() behave from the first scrape and dashboards list every class."""
        f = self.families
        for slo_class in self.slo_classes:
            f.attainment_target.labels(slo_class).set(self.settings.attainment_target(slo_class))
            f.groups.labels(slo_class)
            for model in self.models:
                f.queue_depth.labels(model, slo_class)
                for outcome in REQUEST_OUTCOMES:
                    f.requests.labels(model, slo_class, outcome)
                for instance_id in instances:
                    f.slo_met.labels(model, slo_class, instance_id)
                    f.slo_evaluated.labels(model, slo_class, instance_id)
                    for cause in LIVE_CAUSES:
                        f.slo_missed.labels(model, slo_class, instance_id, str(cause))
        if self._policy:
            for status in (*(str(s) for s in PlanStatus), PLAN_FAILED):
                f.planner_runs.labels(self._policy, status)
        f.leading.set(0)

    def _class(self, slo_class: str | None) -> str:
        return slo_class if slo_class in self._classes else OTHER

    def _model(self, model: str | None) -> str:
        return model if model in self._models else OTHER

    def _labels(self, request: Request) -> tuple[str, str]:
        return self._model(request.model), self._class(request.slo_class)

    # --- api ---------------------------------------------------------------------------------

    def request_admitted(self, request: Request) -> None:
        self.families.requests.labels(*self._labels(request), "admitted").inc()

    def request_rejected(self, model: str, slo_class: str | None, reason: str) -> None:
        self.families.requests.labels(self._model(model), self._class(slo_class), "rejected").inc()
        self.families.rejections.labels(reason).inc()

    def request_cancelled(self, request: Request) -> None:
        self.families.requests.labels(*self._labels(request), "cancelled").inc()
        self._predicted_at_s.pop(request.id, None)

    # --- agents ------------------------------------------------------------------------------

    def request_finished(self, request: Request, result: RequestResult) -> None:
        """A result the queue accepted: outcome, attainment, latencies, prediction error."""
        f = self.families
        labels = self._labels(request)
        f.requests.labels(*labels, _OUTCOME.get(result.state, "failed")).inc()
        predicted_at_s = self._predicted_at_s.pop(request.id, None)
        if result.state is RequestState.CANCELLED:
            return  # the client's choice, not a miss
        instance_id = result.instance_id or NO_MODEL
        f.slo_evaluated.labels(*labels, instance_id).inc()
        if met_slo(request, result):
            f.slo_met.labels(*labels, instance_id).inc()
        else:
            cause = result_cause(request, result)
            if cause is not None:
                f.slo_missed.labels(*labels, instance_id, str(cause)).inc()
        first_s = result.first_token_at_s
        if result.state is not RequestState.COMPLETED or first_s is None:
            return
        f.ttft.labels(*labels).observe(first_s - request.arrival_at_s)
        if request.estimated_wait_s is not None:  # admitted through the API
            f.wait_estimated.labels(*labels).observe(request.estimated_wait_s)
            actual_s = first_s - request.arrival_at_s
            f.wait_estimate_error.labels(labels[1]).observe(actual_s - request.estimated_wait_s)
        if result.finished_at_s is not None:
            f.e2e.labels(*labels).observe(result.finished_at_s - request.arrival_at_s)
        if predicted_at_s is not None:
            f.wait_error.labels(labels[1]).observe(first_s - predicted_at_s)
            f.wait_abs_error.labels(labels[1]).observe(abs(first_s - predicted_at_s))

    def evicted(self, instance_id: str, requests: Iterable[Request], kind: str = "abort") -> None:
        if kind not in EVICTION_KINDS:
            raise ValueError(f"eviction kind {kind!r}: one of {EVICTION_KINDS}")
        now_s = self.clock.now_s()
        for request in requests:
            slo_class = self._class(request.slo_class)
            self.families.evictions.labels(instance_id, slo_class, kind).inc()
            self.events.append(
                PlaneEvent(now_s, "eviction", instance_id, f"{request.id} ({slo_class}, {kind})")
            )

    def model_swap_started(
        self, instance_id: str, model: str, from_model: str | None = None
    ) -> None:
        self.families.swaps.labels(instance_id, self._model(model)).inc()
        before = from_model or "no model"
        self._swapping[instance_id] = (before, model)
        detail = f"{before} -> {model}"
        self.events.append(PlaneEvent(self.clock.now_s(), "swap", instance_id, detail))

    def model_loaded(self, instance_id: str, model: str, load_s: float) -> None:
        """Swap time is observed only for loads a swap started (not the initial load)."""
        swap = self._swapping.get(instance_id)
        if swap is None or swap[1] != model:
            return
        del self._swapping[instance_id]
        self.families.swap_time.labels(self._model(model)).observe(load_s)
        detail = f"{swap[0]} -> {model}: serving after {load_s:.1f} s of loading"
        self.events.append(PlaneEvent(self.clock.now_s(), "swapped", instance_id, detail))

    def instance_status(self, status: InstanceStatus) -> None:
        f = self.families
        iid = status.instance_id
        model = status.model or NO_MODEL
        previous = self._instance_model.get(iid)
        if previous is not None and previous != model:
            for state in EngineState:
                f.instance_state.remove(iid, str(state), previous)
        self._instance_model[iid] = model
        for state in EngineState:
            f.instance_state.labels(iid, str(state), model).set(float(status.state == state))
        f.instance_running.labels(iid).set(status.running)
        capacity = status.kv_capacity_tokens
        f.instance_kv.labels(iid).set(status.kv_used_tokens / capacity if capacity else 0.0)
        f.instance_busy.labels(iid).set(status.busy_s)
        self._prefix_tallies.report(f, status)

    # --- control loop ------------------------------------------------------------------------

    def leadership(self, leading: bool) -> None:
        """A controller that lost the lease zeroes its queue gauges, so that summing over
        controller replicas counts the leader's view once."""
        self.families.leading.set(float(leading))
        if self._leading and not leading:
            self._record_queue((), None)
        self._leading = leading

    def queue_snapshot(self, queued: Sequence[Request], plan: PublishedPlan | None) -> None:
        """Queue depth and live groups. Called every round; recorded at most once per
        `sample_every_s` (a scrape is no more frequent), so a long queue costs the loop one
        pass per interval, not one per round."""
        now_s = self.clock.monotonic_s()
        if now_s - self._snapshot_at_s < self.settings.sample_every_s:
            return
        self._snapshot_at_s = now_s
        self._record_queue(queued, plan)
        self.history.maybe_sample(self.clock.now_s(), self.registry)

    def _record_queue(self, queued: Sequence[Request], plan: PublishedPlan | None) -> None:
        f = self.families
        depth: Tally[tuple[str, str]] = Tally()
        for key, n in Tally((r.model, r.slo_class) for r in queued).items():
            depth[self._model(key[0]), self._class(key[1])] += n
        for labels in {*depth, *((m, c) for m in self.models for c in self.slo_classes)}:
            f.queue_depth.labels(*labels).set(depth.get(labels, 0))
        groups = Tally(self._class(g.slo_class) for g in _live_groups(plan, queued))
        for slo_class in {*groups, *self.slo_classes}:
            f.groups.labels(slo_class).set(groups.get(slo_class, 0))

    def planned(
        self, solve: Plan | None, plan: PublishedPlan, queued: Sequence[Request], now_s: float
    ) -> None:
        """A full re-plan: solve time and status, and each newly placed request's predicted
        first-token time (kept to pair with the actual one when it completes here)."""
        f = self.families
        if solve is not None:
            f.planner_runs.labels(self._policy, str(solve.status)).inc()
            f.solve.labels(self._policy).observe(solve.solve_wall_s)
        waits = plan.forecast.predicted_wait_s
        for request in queued:
            wait_s = waits.get(request.id)
            if wait_s is None or request.id in self._predicted_at_s:
                continue
            self._predicted_at_s[request.id] = now_s + wait_s
            predicted_s = now_s + wait_s - request.arrival_at_s
            f.wait_predicted.labels(*self._labels(request)).observe(predicted_s)
        while len(self._predicted_at_s) > _MAX_PREDICTIONS:
            self._predicted_at_s.popitem(last=False)

    def plan_failed(self) -> None:
        self.families.planner_runs.labels(self._policy, PLAN_FAILED).inc()


def _live_groups(plan: PublishedPlan | None, queued: Sequence[Request]) -> list[PlannedGroup]:
    if plan is None or not queued:
        return []
    queued_ids = {r.id for r in queued}
    return [g for g in plan.groups.values() if any(rid in queued_ids for rid in g.request_ids)]
