"""The QLM policy core's configuration (`QlmConfig`: SLO classes, grouping, estimator, planner,
control, autoscale): the `qlm:` section of a fleet file, `config:` in a snapshot, `qlm:` in a
scenario."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from qlm.config.strict import StrictModel
from qlm.types import DEFAULT_SLO_CLASSES, SloClass


class SloClassConfig(StrictModel):
    name: str = Field(min_length=1, description="Class name used in request tags.")
    ttft_s: float = Field(gt=0, le=7 * 24 * 3600, description="Time-to-first-token target.")
    completion_s: float | None = Field(
        default=None, gt=0, description="Optional end-to-end target."
    )
    lateness_weight: float = Field(
        default=1.0, ge=0, description="Planner penalty per request-second past the target."
    )
    priority: int = Field(default=0, description="Larger is more urgent (eviction order).")
    paced: bool = Field(
        default=False,
        description="The class promises a deadline, not a latency (batch jobs): its requests "
        "start no earlier than their deadline needs (qlm/agents/pacing.py), leaving engines "
        "to latency-bound classes meanwhile.",
    )

    @model_validator(mode="after")
    def _completion_after_ttft(self) -> SloClassConfig:
        if self.completion_s is not None and self.completion_s < self.ttft_s:
            raise ValueError("completion_s must be >= ttft_s")
        return self

    def to_slo_class(self) -> SloClass:
        return SloClass(
            self.name, self.ttft_s, self.completion_s, self.lateness_weight, self.priority
        )


class GroupingConfig(StrictModel):
    policy: str = Field(default="kmeans", description="Registered grouping policy name.")
    avg_batch_size: int = Field(default=32, ge=1, description="Typical engine batch size.")
    delta: float = Field(
        default=4.0, gt=0, description="Split groups larger than avg_batch_size x delta."
    )
    requests_per_cluster: int = Field(
        default=256, ge=1, description="k = ceil(n / requests_per_cluster) per model."
    )
    max_clusters_per_model: int = Field(default=64, ge=1, description="Upper bound on k.")
    max_kmeans_iter: int = Field(default=50, ge=1, le=1000)
    recluster_every_inserts: int = Field(
        default=1000, ge=1, description="Full re-cluster after this many incremental inserts."
    )
    seed: int = Field(default=0, description="Seed for k-means initialisation.")

    @property
    def max_group_size(self) -> int:
        return max(1, int(self.avg_batch_size * self.delta))


class EstimatorConfig(StrictModel):
    policy: str = Field(default="rwt", description="Registered estimator name.")
    percentile: float = Field(
        default=0.95, gt=0.5, lt=1.0, description="Quantile reported and used for violations."
    )


PlannerBackend = Literal["pulp-cbc", "pulp-highs", "cpsat"]


class PlannerConfig(StrictModel):
    policy: str = Field(default="milp", description="Registered planner: milp, edf or fcfs.")
    backend: PlannerBackend = Field(default="cpsat", description="MILP backend.")
    time_limit_s: float = Field(default=0.8, gt=0, le=600, description="Solver wall limit.")
    max_slots_per_queue: int = Field(
        default=8, ge=1, le=64, description="Bound on planned groups per virtual queue."
    )
    max_planning_groups: int = Field(
        default=64, ge=1, description="Coarsen to at most this many groups before solving."
    )
    threads: int = Field(default=2, ge=1, le=64, description="Solver worker threads.")
    warm_start: bool = Field(
        default=True, description="Start the solver from the EDF plan improved by local search."
    )
    search_s_per_request: float | None = Field(
        default=0.005,
        ge=0,
        description="milp: the solver's budget per re-plan is this many seconds per request "
        "that arrived since the last full re-plan, up to time_limit_s (or deterministic_work); "
        "under 0.05 s the plan is EDF improved by local search alone. Bounds the solver's CPU "
        "per request where re-plans are many and small. None: always the full budget.",
    )
    deterministic_work: float | None = Field(
        default=None,
        gt=0,
        le=600,
        description="CP-SAT only: stop after this much deterministic work (CP-SAT's "
        "'deterministic seconds', on one worker) instead of wall time, so the same input gives "
        "the same plan on any machine; the wall limit stays as a safety net (x10). The "
        "simulator turns this on for reproducible runs.",
    )


class ControlConfig(StrictModel):
    """When the control loop re-checks and re-plans (qlm/control/driver.py). The same fields,
    with the same meaning, for the live plane (fleet file, `qlm.control`) and the simulator
    (scenario file, `qlm.control`)."""

    tick_s: float = Field(
        default=5.0,
        gt=0,
        description="Run the estimator's violation check over the queue this often (arrivals "
        "that fit no planned group ask for a re-plan at once, whatever the tick).",
    )
    min_replan_interval_s: float = Field(
        default=1.0,
        ge=0,
        description="Full re-plans (regroup + solve) start at most this often once a plan "
        "exists; arrivals in between join their planned groups.",
    )
    published_members_per_instance: int = Field(
        default=512,
        ge=1,
        description="Queued requests per virtual queue that agents see (the head they admit "
        "from); the rest is shown as the head leaves.",
    )
    pacing_factor: float = Field(
        default=2.0,
        ge=1.0,
        description="Paced classes run to end by their deadline compressed by this factor "
        "(2: by half the time left; 1: as late as possible).",
    )
    prefill_backlog_s: float | None = Field(
        default=1.0,
        gt=0,
        description="Prefill an engine may have queued (admitted prompts before their first "
        "token), in seconds of its prefill speed; past it work waits in the global queue, "
        "where urgency orders it (qlm/agents/budget.py). None: no bound.",
    )


class AutoscalePoolConfig(StrictModel):
    """One pool the controller sizes (qlm/autoscale/need.py): the fleet's instances
    <instance_prefix>-0 .. <instance_prefix>-<max_replicas - 1>, one GPU type."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="Pool name (the metrics' pool label, a DNS label).",
    )
    instance_prefix: str = Field(
        min_length=1,
        description="The pool's instances are <prefix>-0, <prefix>-1, ... in the fleet (a "
        "StatefulSet's pods); scale-down removes the highest ordinals first.",
    )
    min_replicas: int = Field(default=0, ge=0, le=100_000)
    max_replicas: int = Field(ge=1, le=100_000)
    statefulset: str | None = Field(
        default=None,
        min_length=1,
        description="The Kubernetes StatefulSet whose scale the controller sets (with "
        "controller.scaling.kubernetes); none: the desired replicas are only published.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalePoolConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"pool {self.name}: min_replicas > max_replicas")
        return self


class AutoscaleConfig(StrictModel):
    """Replicas per pool from the queued and forecast demand (qlm/autoscale/need.py)."""

    pools: tuple[AutoscalePoolConfig, ...] = Field(
        default=(), description="Pools to size; none: no autoscaling."
    )
    target_utilization: float = Field(
        default=0.8,
        gt=0,
        le=1,
        description="Busy share of an instance the forecast demand may take (headroom for "
        "bursts and swaps).",
    )
    window_s: float = Field(
        default=300.0, gt=0, description="Arrival rates are measured over this much time."
    )
    scale_down_stabilization_s: float = Field(
        default=300.0,
        ge=0,
        description="A pool shrinks only to the largest need of this much past time (scale-up "
        "is immediate), so a dip does not drop replicas a returning load needs.",
    )
    drain_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="A draining instance still busy after this long is removed anyway (its "
        "requests go back to the queue; none is lost).",
    )

    @model_validator(mode="after")
    def _unique(self) -> AutoscaleConfig:
        names = [p.name for p in self.pools]
        prefixes = [p.instance_prefix for p in self.pools]
        if len(names) != len(set(names)) or len(prefixes) != len(set(prefixes)):
            raise ValueError("autoscale.pools: names and instance prefixes must be unique")
        return self


class QlmConfig(StrictModel):
    slo_classes: tuple[SloClassConfig, ...] = Field(
        default_factory=lambda: tuple(
            SloClassConfig(
                name=c.name,
                ttft_s=c.ttft_s,
                completion_s=c.completion_s,
                lateness_weight=c.lateness_weight,
                priority=c.priority,
            )
            for c in DEFAULT_SLO_CLASSES
        )
    )
    default_slo_class: str = "interactive"
    grouping: GroupingConfig = Field(default_factory=GroupingConfig)
    estimator: EstimatorConfig = Field(default_factory=EstimatorConfig)
    planner: PlannerConfig = Field(default_factory=PlannerConfig)
    control: ControlConfig = Field(default_factory=ControlConfig)
    autoscale: AutoscaleConfig = Field(default_factory=AutoscaleConfig)

    @model_validator(mode="after")
    def _classes_consistent(self) -> QlmConfig:
        names = [c.name for c in self.slo_classes]
        if len(names) != len(set(names)):
            raise ValueError("slo_classes: names must be unique")
        if self.default_slo_class not in names:
            raise ValueError(f"default_slo_class {self.default_slo_class!r} is not one of {names}")
        return self

    def slo_class_map(self) -> dict[str, SloClass]:
        return {c.name: c.to_slo_class() for c in self.slo_classes}
