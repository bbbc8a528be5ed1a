"""`llmd`, after llm-d's inference scheduler (endpoint picker with flow control): requests wait
at the gateway in priority bands and are routed one at a time to the best-scored instance.

* Bands: one per SLO class priority (higher first, strictly); inside a band, earliest TTFT
  deadline first (llm-d's SLO-deadline ordering). One set of bands per model pool.
* Saturation: an instance takes no more requests while its engine has `queue_threshold`
  requests waiting (admitted, no first token yet) or its KV cache is `kv_threshold` full.
* Routing: among unsaturated instances of the model, the highest score
  w_queue (1 - waiting / queue_threshold) + w_kv (1 - kv used / kv capacity); ties: fleet order.
* Static placement: no model swaps, no eviction.

Engine metrics are read when an instance reports events and then updated locally as requests
are routed to it, like scraped metrics between scrapes.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from qlm.agents.actions import Action, Pull
from qlm.engine.engine_types import EngineEvent
from qlm.sim.policies.policy_base import NO_ACTIONS, SIM_POLICIES, Actions, BasePolicy, SimContext
from qlm.types import Request

_Entry = tuple[int, float, int, Request]


@dataclass(slots=True)
class _Metrics:
    waiting: int
    kv_used_tokens: int
    kv_capacity_tokens: int


@SIM_POLICIES.register("llmd")
class LlmdPolicy(BasePolicy):
    name = "llmd"

    def __init__(
        self,
        queue_threshold: int = 5,
        kv_threshold: float = 0.8,
        queue_weight: float = 1.0,
        kv_weight: float = 1.0,
    ) -> None:
        super().__init__()
        self.queue_threshold = queue_threshold
        self.kv_threshold = kv_threshold
        self.queue_weight = queue_weight
        self.kv_weight = kv_weight
        self._pools: dict[str, list[str]] = {}
        self._bands: dict[str, list[_Entry]] = {}  # model -> (band, deadline) heap
        self._metrics: dict[str, _Metrics] = {}
        self._priority: dict[str, int] = {}
        self._sequence = itertools.count()

    def start(self, ctx: SimContext) -> Actions:
        super().start(ctx)
        self._priority = {c.name: c.priority for c in ctx.config.slo_classes}
        for instance in ctx.fleet.instances:
            model = ctx.model_of(instance.id)
            if model is not None:
                self._pools.setdefault(model, []).append(instance.id)
        return NO_ACTIONS

    def on_arrival(self, request: Request) -> Actions:
        self._push(request)
        return self._dispatch(request.model)

    def on_requeued(self, requests: Sequence[Request]) -> Actions:
        for request in requests:
            self._push(request)
        return NO_ACTIONS

    def on_engine_events(self, instance_id: str, events: Sequence[EngineEvent]) -> Actions:
        self._metrics.pop(instance_id, None)
        model = self.ctx.model_of(instance_id)
        return NO_ACTIONS if model is None else self._dispatch(model)

    def _push(self, request: Request) -> None:
        band = -self._priority.get(request.slo_class, 0)
        entry = (band, request.ttft_deadline_at_s, next(self._sequence), request)
        heapq.heappush(self._bands.setdefault(request.model, []), entry)

    def _dispatch(self, model: str) -> Actions:
        heap = self._bands.get(model)
        pool = self._pools.get(model, [])
        actions: list[Action] = []
        while heap:
            target = self._pick(pool, heap[0][3])
            if target is None:
                break
            request = heapq.heappop(heap)[3]
            self._routed(target, request)
            metrics = self._metrics_of(target)
            metrics.waiting += 1
            metrics.kv_used_tokens += request.prompt_tokens
            actions.append(Pull(target, (request.id,)))
        return tuple(actions)

    def _routed(self, instance_id: str, request: Request) -> None:
        """A request is sent to the instance (subclasses keep state on it)."""

    def _bonus(self, instance_id: str, request: Request) -> float:
        """Added to the instance's score for this request (scorers of subclasses)."""
        return 0.0

    def _pick(self, pool: Sequence[str], request: Request) -> str | None:
        best: tuple[float, str] | None = None
        for instance_id in pool:
            m = self._metrics_of(instance_id)
            kv_util = m.kv_used_tokens / m.kv_capacity_tokens if m.kv_capacity_tokens else 1.0
            if m.waiting >= self.queue_threshold or kv_util >= self.kv_threshold:
                continue
            score = self.queue_weight * (1 - m.waiting / self.queue_threshold) + self.kv_weight * (
                1 - kv_util
            )
            score += self._bonus(instance_id, request)
            if best is None or score > best[0]:
                best = (score, instance_id)
        return None if best is None else best[1]

    def _metrics_of(self, instance_id: str) -> _Metrics:
        metrics = self._metrics.get(instance_id)
        if metrics is None:
            obs = self.ctx.observe(instance_id)
            waiting = sum(not r.started for r in obs.active)
            metrics = _Metrics(waiting, obs.kv_used_tokens, obs.kv_capacity_tokens)
            self._metrics[instance_id] = metrics
        return metrics
