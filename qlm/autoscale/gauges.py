"""The autoscaler's decisions as Prometheus gauges (qlm/autoscale/replicas.py).

`qlm_pool_desired_replicas{pool}` is what a HorizontalPodAutoscaler (or KEDA) on an external
metric scales the pool's StatefulSet to: it drops only once the instances it gives up have
drained, so a scaler that follows it removes no busy instance.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Gauge

from qlm.autoscale.replicas import ScaleDecision


class ScalingGauges:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.desired = Gauge(
            "qlm_pool_desired_replicas",
            "Replicas the pool should have now: the need after the scale-down stabilization "
            "window, lowered only once the instances it gives up are idle.",
            ("pool",),
            registry=registry,
        )
        self.needed = Gauge(
            "qlm_pool_needed_instances",
            "Instances the queued and forecast demand needs in the pool (before rounding) at "
            "the target utilisation.",
            ("pool",),
            registry=registry,
        )
        self.draining = Gauge(
            "qlm_pool_draining_instances",
            "Instances of the pool given no new work because the pool is scaling down.",
            ("pool",),
            registry=registry,
        )

    def publish(self, decisions: Iterable[ScaleDecision]) -> None:
        for d in decisions:
            self.desired.labels(d.pool).set(d.replicas)
            self.needed.labels(d.pool).set(d.units)
            self.draining.labels(d.pool).set(len(d.draining))
