"""The `metrics:` section of the fleet file: where standalone processes expose /metrics, the
attainment targets the alert rules compare against, and where the dashboard reads from.
Nothing here reads the environment."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, HttpUrl

from qlm.config import StrictModel

Share = Annotated[float, Field(gt=0, le=1)]


class MetricsConfig(StrictModel):
    """The fleet file's `metrics:` section."""

    host: str = Field(
        default="0.0.0.0",  # all interfaces: a pod's metrics port is scraped from outside
        description="Address of the metrics port of `qlm controller` and `qlm agent`.",
    )
    port: int = Field(
        default=9400,
        ge=0,
        le=65535,
        description="Metrics port of `qlm controller` and `qlm agent` (the API serves /metrics "
        "on its own port); 0 picks a free port.",
    )
    default_attainment_target: float = Field(
        default=0.99,
        gt=0,
        le=1,
        description="Share of requests that must meet their SLO, for classes not listed in "
        "attainment_targets; exported as qlm_slo_attainment_target for the alert rules.",
    )
    attainment_targets: dict[str, Share] = Field(
        default_factory=dict, description="Attainment target per SLO class name, in (0, 1]."
    )
    prometheus_url: HttpUrl | None = Field(
        default=None,
        description="The dashboard reads a Prometheus that scrapes every replica instead of "
        "this process's own metrics (needed when API, controller and agents run apart).",
    )
    prometheus_timeout_s: float = Field(
        default=2.0, gt=0, le=60, description="Per-query timeout against prometheus_url."
    )
    history_s: float = Field(
        default=600.0, ge=10, le=86_400, description="How far back the dashboard's charts go."
    )
    sample_every_s: float = Field(
        default=1.0, gt=0, le=60, description="Dashboard history resolution (own registry)."
    )
    recent_events: int = Field(
        default=50, ge=1, le=10_000, description="Swaps and evictions the dashboard lists."
    )

    def attainment_target(self, slo_class: str) -> float:
        return self.attainment_targets.get(slo_class, self.default_attainment_target)

    def check_classes(self, known: set[str]) -> None:
        """attainment_targets may only name configured classes (a typo would silently leave
        the class on the default target)."""
        for name in self.attainment_targets:
            if name not in known:
                raise ValueError(
                    f"metrics.attainment_targets: {name!r} is not an SLO class; "
                    f"known: {sorted(known)}"
                )
