"""The live plane's pool scaling: the autoscaling LSO (qlm/autoscale/need.py and
scaling.py) fed by the control loop's rounds, applied through a `ReplicaSetter`.

Each round the control loop hands over what it read (queued requests, agents' reports, the
instances that are up); every `qlm.control.tick_s` this decides each pool's replicas,
publishes them (qlm/autoscale/gauges.py) and, when they change, sets them: through the
Kubernetes API (qlm/autoscale/kubernetes.py) with `controller.kubernetes_scaling`, else
nowhere (an HPA or KEDA follows the published gauge). It returns the instances that drain:
the loop plans nothing onto them, so they empty before the pool shrinks.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping, Sequence
from typing import Protocol

from prometheus_client import CollectorRegistry

from qlm.autoscale.demand import DemandWindow
from qlm.autoscale.gauges import ScalingGauges
from qlm.autoscale.need import Pool, pool_needs, pools_of
from qlm.autoscale.replicas import Autoscaler, ScaleDecision
from qlm.config import ConfigError, QlmConfig
from qlm.config.serve_config import ServeConfig
from qlm.queue.records import InstanceStatus
from qlm.types import Fleet, Request

log = logging.getLogger("qlm.scaling")


class ReplicaSetter(Protocol):
    """Where a pool's replica count lives (a StatefulSet's scale)."""

    async def replicas(self, pool: str) -> int | None:
        """The count set now; None: unknown (the autoscaler starts from what is up)."""
        ...

    async def set_replicas(self, pool: str, replicas: int) -> None: ...


class PoolScaling:
    def __init__(
        self,
        config: QlmConfig,
        fleet: Fleet,
        pools: Sequence[Pool],
        setter: ReplicaSetter | None = None,
        gauges: ScalingGauges | None = None,
    ) -> None:
        self.config = config.autoscale
        self.fleet = fleet
        self.pools = tuple(pools)
        self.every_s = config.control.tick_s
        self.setter = setter
        self.gauges = gauges
        self.window = DemandWindow(self.config.window_s)
        self.autoscaler: Autoscaler | None = None
        self.decisions: tuple[ScaleDecision, ...] = ()
        self._last_s: float | None = None

    def draining(self) -> frozenset[str]:
        return frozenset(i for d in self.decisions for i in d.draining)

    async def round(
        self,
        queued: Sequence[Request],
        statuses: Sequence[InstanceStatus],
        up: Collection[str],
        now_s: float,
    ) -> frozenset[str]:
        """Note arrivals; decide when a tick is due; the instances draining now."""
        for request in queued:
            self.window.arrived(request)
        if self._last_s is not None and now_s - self._last_s < self.every_s:
            return self.draining()
        self._last_s = now_s
        if self.autoscaler is None:
            reported = {s.instance_id for s in statuses} & set(up)
            self.autoscaler = Autoscaler(self.config, self.pools, await self._current(reported))
        needs = pool_needs(
            self.pools, self.fleet, self.window.demand(now_s), queued, now_s, self.config
        )
        before = dict(self.autoscaler.current)
        self.decisions = self.autoscaler.decide(now_s, needs, busy_of(statuses))
        if self.gauges is not None:
            self.gauges.publish(self.decisions)
        await self._apply(before)
        return self.draining()

    async def _current(self, up: Collection[str]) -> dict[str, int]:
        """Each pool's replicas: the setter's, else its instances up and reporting."""
        current: dict[str, int] = {}
        for pool in self.pools:
            known = await self.setter.replicas(pool.name) if self.setter is not None else None
            current[pool.name] = (
                known if known is not None else sum(i.id in up for i in pool.instances)
            )
        return current

    async def _apply(self, before: Mapping[str, int]) -> None:
        if self.setter is None:
            return
        for d in self.decisions:
            if d.replicas != before.get(d.pool):
                log.info(
                    "pool %s: %d -> %d replicas (need %.2f instances)",
                    d.pool,
                    before.get(d.pool, 0),
                    d.replicas,
                    d.units,
                )
                await self.setter.set_replicas(d.pool, d.replicas)


def busy_of(statuses: Sequence[InstanceStatus]) -> dict[str, bool]:
    """An instance is busy while its engine holds requests (running or admitted)."""
    return {s.instance_id: s.running > 0 or s.busy_s > 0 for s in statuses}


def pool_scaling(
    config: ServeConfig, fleet: Fleet, registry: CollectorRegistry
) -> PoolScaling | None:
    """The fleet file's pool scaling (qlm.autoscale, controller.kubernetes_scaling), or None
    when it sizes no pool; ConfigError naming the field that is wrong."""
    autoscale = config.qlm.autoscale
    if not autoscale.pools:
        if config.controller.kubernetes_scaling:
            raise ConfigError("controller.kubernetes_scaling: qlm.autoscale.pools is empty")
        return None
    costs = {i.gpu_type: config.fleet_config.cost_per_hour(i.gpu_type) for i in fleet.instances}
    try:
        pools = pools_of(autoscale, fleet, costs, _standby_slots(config))
        setter: ReplicaSetter | None = None
        if config.controller.kubernetes_scaling:
            from qlm.autoscale.kubernetes import in_cluster

            setter = in_cluster(autoscale, config.controller.kubernetes_namespace)
    except ValueError as exc:
        raise ConfigError(f"qlm.autoscale: {exc}") from exc
    return PoolScaling(config.qlm, fleet, pools, setter, ScalingGauges(registry))


def _standby_slots(config: ServeConfig) -> int:
    """Models each instance keeps asleep: the vLLM engines' standby servers."""
    if config.engine.kind != "vllm":
        return 0
    slots = config.engine.vllm.get("standby_models", 0)
    return slots if isinstance(slots, int) else 0
