"""When a pool's replica count changes: hysteresis, and scale-down only after a drain.

Question answered: the pools' needs move every round (qlm/autoscale/need.py); what replica
count should each pool be set to now? `Autoscaler.decide`:

* scales up at once to the need (a new instance takes its load time to help, so waiting
  would only add misses);
* scales down only to the largest need of the last `scale_down_stabilization_s` (the
  HorizontalPodAutoscaler's stabilization window), so a dip does not drop instances the load
  needs again a minute later;
* never removes a busy instance: the instances above the desired count (the highest ordinals,
  which a StatefulSet removes first) are *draining*: the planner gives them no new work, and
  the pool is set to the smaller count once every one of them is idle, or once one has drained
  for `drain_timeout_s` (its requests then go back to the queue through their leases; nothing
  is lost, some work is redone).

Pure: the caller passes `now_s` and which instances are busy, and applies `replicas` (patches
the StatefulSet, or only publishes it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from qlm.autoscale.need import Pool, PoolNeed
from qlm.config import AutoscaleConfig


@dataclass(frozen=True, slots=True)
class ScaleDecision:
    pool: str
    current: int  # replicas the pool is set to now
    needed: int  # this round's need
    desired: int  # after the stabilization window
    replicas: int  # what to set now: desired, or current while instances still drain
    draining: tuple[str, ...]  # instances to give no new work (above desired, still there)
    units: float  # the need before rounding


class Autoscaler:
    def __init__(
        self, config: AutoscaleConfig, pools: Sequence[Pool], current: Mapping[str, int]
    ) -> None:
        self.config = config
        self.pools = {p.name: p for p in pools}
        self.current = {p.name: _clamp(p, current.get(p.name, p.min_replicas)) for p in pools}
        self._needs: dict[str, deque[tuple[float, int]]] = {p.name: deque() for p in pools}
        self._draining_since: dict[str, float] = {}

    def decide(
        self, now_s: float, needs: Mapping[str, PoolNeed], busy: Mapping[str, bool]
    ) -> tuple[ScaleDecision, ...]:
        """This round's decision per pool; `busy[instance]`: it still holds requests."""
        decisions = tuple(self._decide_pool(p, now_s, needs, busy) for p in self.pools.values())
        draining = {i for d in decisions for i in d.draining}
        self._draining_since = {i: self._draining_since.get(i, now_s) for i in sorted(draining)}
        for d in decisions:
            self.current[d.pool] = d.replicas
        return decisions

    def _decide_pool(
        self, pool: Pool, now_s: float, needs: Mapping[str, PoolNeed], busy: Mapping[str, bool]
    ) -> ScaleDecision:
        need = needs.get(pool.name)
        needed = _clamp(pool, need.replicas if need is not None else pool.min_replicas)
        window = self._needs[pool.name]
        window.append((now_s, needed))
        while window and window[0][0] < now_s - self.config.scale_down_stabilization_s:
            window.popleft()
        current = self.current[pool.name]
        desired = needed if needed >= current else min(current, max(n for _, n in window))
        leaving = tuple(i.id for i in pool.instances[desired:current])
        drained = all(
            not busy.get(i, False)
            or now_s - self._draining_since.get(i, now_s) >= self.config.drain_timeout_s
            for i in leaving
        )
        replicas = desired if desired >= current or drained else current
        return ScaleDecision(
            pool=pool.name,
            current=current,
            needed=needed,
            desired=desired,
            replicas=replicas,
            draining=() if replicas == desired else leaving,
            units=need.units if need is not None else 0.0,
        )


def _clamp(pool: Pool, replicas: int) -> int:
    return min(pool.max_replicas, max(pool.min_replicas, replicas))
