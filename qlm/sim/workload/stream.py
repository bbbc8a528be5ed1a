"""What is one stream of requests? `StreamConfig`: its arrival process, when it starts and ends,
its rate shape, its model and SLO-class mixes and its lengths, checked for consistency.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, model_validator

from qlm.config import StrictModel
from qlm.sim.workload.arrivals import (
    Arrivals,
    BacklogArrivals,
    BurstConfig,
    GammaArrivals,
    PoissonArrivals,
    RampConfig,
    TraceArrivals,
)
from qlm.sim.workload.lengths import FixedLengths, Lengths, ReplayLengths, TraceLengths
from qlm.sim.workload.prefixes import Prefixes, TracePrefixes
from qlm.sim.workload.rates import RateProfile

Weights = Annotated[dict[str, Annotated[float, Field(gt=0)]], Field(min_length=1)]


class StreamConfig(StrictModel):
    """One stream of requests. Needs count or duration_s, except a trace replay (which ends
    with its trace)."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$", description="Id prefix.")
    arrivals: Arrivals
    start_s: float = Field(default=0.0, ge=0, description="When the stream begins.")
    count: int | None = Field(default=None, ge=1, le=100_000_000)
    duration_s: float | None = Field(default=None, gt=0)
    ramp: RampConfig | None = None
    bursts: tuple[BurstConfig, ...] = ()
    models: Weights = Field(description="Model name -> weight.")
    classes: Weights = Field(description="SLO class name -> weight.")
    lengths: Lengths | None = Field(default=None, description="Default: replay (traces only).")
    prefixes: Prefixes | None = Field(
        default=None, description="Shared prompt prefixes (qlm/sim/workload/prefixes.py)."
    )
    job_plan: bool = Field(
        default=False,
        description="Plan this backlog as one batch job, as the Batch API does: groups by "
        "shared prefix, long decodes first, parts sized to an engine batch "
        "(qlm/prefixes/job_plan.py).",
    )

    @model_validator(mode="after")
    def _consistent(self) -> StreamConfig:
        arrivals = self.arrivals
        shaped = self.ramp is not None or bool(self.bursts)
        if isinstance(arrivals, BacklogArrivals):
            if self.count is None:
                raise ValueError("a backlog needs count")
            if self.duration_s is not None or shaped:
                raise ValueError("a backlog takes no duration_s, ramp or bursts")
        elif isinstance(arrivals, TraceArrivals):
            if shaped:
                raise ValueError("trace arrivals take no ramp or bursts (use time_scale)")
        elif self.count is None and self.duration_s is None:
            raise ValueError("poisson and gamma streams need count or duration_s")
        if self.ramp is not None and self.ramp.end_s is None and self.duration_s is None:
            raise ValueError("ramp needs end_s or the stream's duration_s")
        if self.ramp is not None and self._ramp_end_s() <= self.ramp.start_s:
            raise ValueError("ramp must end after it starts")
        if self.job_plan and not isinstance(arrivals, BacklogArrivals):
            raise ValueError("job_plan needs backlog arrivals (a job is submitted whole)")
        if self.lengths is None and not isinstance(arrivals, TraceArrivals):
            raise ValueError("lengths is required unless arrivals replay a trace")
        if isinstance(self.lengths, ReplayLengths) and not isinstance(arrivals, TraceArrivals):
            raise ValueError("lengths source 'replay' needs trace arrivals")
        if isinstance(self.prefixes, TracePrefixes) and self._length_format() != "mooncake":
            raise ValueError(
                "prefixes source 'trace' needs lengths from a trace with block ids "
                "(format mooncake)"
            )
        return self

    def _length_format(self) -> str | None:
        """The trace format the lengths come from (None: fixed lengths)."""
        if isinstance(self.lengths, TraceLengths):
            return self.lengths.format
        if isinstance(self.arrivals, TraceArrivals) and not isinstance(self.lengths, FixedLengths):
            return self.arrivals.format
        return None

    def _ramp_end_s(self) -> float:
        assert self.ramp is not None
        end = self.ramp.end_s if self.ramp.end_s is not None else self.duration_s
        assert end is not None
        return end

    def with_rate_scale(self, factor: float) -> StreamConfig:
        """Rates x factor (trace times / factor); a backlog is unchanged."""
        arrivals = self.arrivals
        update: dict[str, object] = {}
        if isinstance(arrivals, PoissonArrivals | GammaArrivals):
            update["arrivals"] = arrivals.model_copy(
                update={"rate_per_s": arrivals.rate_per_s * factor}
            )
            if self.ramp is not None:
                update["ramp"] = self.ramp.model_copy(
                    update={"to_rate_per_s": self.ramp.to_rate_per_s * factor}
                )
        elif isinstance(arrivals, TraceArrivals):
            update["arrivals"] = arrivals.model_copy(
                update={"time_scale": arrivals.time_scale / factor}
            )
        return self.model_copy(update=update)

    def rate_profile(self) -> RateProfile:
        """The Poisson or gamma stream's rate over time, relative to its start."""
        arrivals = self.arrivals
        assert isinstance(arrivals, PoissonArrivals | GammaArrivals)
        ramp = None
        if self.ramp is not None:
            ramp = (self.ramp.start_s, self._ramp_end_s(), self.ramp.to_rate_per_s)
        bursts = tuple((b.start_s, b.start_s + b.duration_s, b.factor) for b in self.bursts)
        return RateProfile.build(arrivals.rate_per_s, ramp, bursts)
