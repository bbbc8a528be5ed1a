"""Prometheus metrics of the live control plane, and the SLO-attainment dashboard's data.

One `PlaneMetrics` per process, on a registry the process creates; the API, agents and control
loop call its hooks (NO_METRICS when a process exports nothing). README.md lists every metric.
"""

from qlm.config.metrics_settings import MetricsConfig
from qlm.metrics.dashboard import Dashboard, DashboardSource, LocalSource, build_view
from qlm.metrics.exposition import MetricsServer, render
from qlm.metrics.hooks import NO_METRICS, MetricsHooks, PlaneEvent, met_slo
from qlm.metrics.recorder import PlaneMetrics

__all__ = [
    "NO_METRICS",
    "Dashboard",
    "DashboardSource",
    "LocalSource",
    "MetricsConfig",
    "MetricsHooks",
    "MetricsServer",
    "PlaneEvent",
    "PlaneMetrics",
    "build_view",
    "met_slo",
    "render",
]
