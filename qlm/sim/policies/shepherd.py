"""`shepherd`, after SHEPHERD (Zhang et al., NSDI'23): a static model-to-GPU partition and,
per instance, deadline-aware preemptive batching.

Herd level (static): instances keep the model loaded at the start; each arrival is assigned to
the instance of its model where its work would drain first: requests assigned there (held plus
queued, plus this one) over the instance's token throughput at the batch size its KV cache
holds for such requests (ties: fleet order). It stays with that instance.

Shepherd level (per instance): its requests wait in a queue ordered by TTFT deadline and enter
the engine while it has a free sequence slot and KV room for prompt plus output cap (the same
admission budget as QLM's agents, `AdmissionBook`). When the head does not fit and would miss
its deadline waiting for the next request to finish (the running one closest to done, at the
current decode step time) but could still make it if admitted now, the running request with the
latest deadline (later than the head's) is preempted: evicted, back into this instance's queue
by its own deadline, restarting from scratch (recompute). One victim per decision; the eviction
frees room and the decision repeats.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Sequence

from qlm.agents.actions import Action, Evict, Pull
from qlm.engine.engine_types import Aborted, EngineEvent, RequestFinished
from qlm.sim.policies.policy_base import (
    NO_ACTIONS,
    SIM_POLICIES,
    Actions,
    AdmissionBook,
    BasePolicy,
    SimContext,
    kv_need_tokens,
)
from qlm.types import Request

_Entry = tuple[float, int, Request]


@SIM_POLICIES.register("shepherd")
class ShepherdPolicy(BasePolicy):
    name = "shepherd"

    def __init__(self) -> None:
        super().__init__()
        self._pools: dict[str, list[str]] = {}  # model -> instance ids (static partition)
        self._queues: dict[str, list[_Entry]] = {}  # instance id -> deadline heap
        self._home: dict[str, str] = {}  # request id -> instance id
        self._requests: dict[str, Request] = {}  # held or queued here, by id
        self._book = AdmissionBook()
        self._frees_at_s: dict[str, float] = {}  # instance -> next finish, while the batch holds
        self._sequence = itertools.count()
        self._preemptions = 0

    def start(self, ctx: SimContext) -> Actions:
        super().start(ctx)
        for instance in ctx.fleet.instances:
            self._book.refresh(ctx, instance.id)
            self._queues[instance.id] = []
            model = ctx.model_of(instance.id)
            if model is not None:
                self._pools.setdefault(model, []).append(instance.id)
        return NO_ACTIONS

    def on_arrival(self, request: Request) -> Actions:
        pool = self._pools.get(request.model)
        if not pool:
            return NO_ACTIONS
        home = min(pool, key=lambda i: self._drain_key(i, request))
        self._home[request.id] = home
        self._requests[request.id] = request
        self._push(home, request)
        return self._serve(home)

    def on_requeued(self, requests: Sequence[Request]) -> Actions:
        for request in requests:
            self._push(self._home[request.id], request)
        return NO_ACTIONS

    def on_engine_events(self, instance_id: str, events: Sequence[EngineEvent]) -> Actions:
        self._book.on_events(self.ctx, instance_id, events)
        for event in events:
            if isinstance(event, RequestFinished | Aborted):
                self._frees_at_s.pop(instance_id, None)
                if isinstance(event, RequestFinished):
                    self._requests.pop(event.request_id, None)
        return self._serve(instance_id)

    def stats(self) -> dict[str, float]:
        return {"preemptions": self._preemptions}

    def _drain_key(self, instance_id: str, request: Request) -> float:
        profile = self.profile_on(instance_id)
        assigned = self.ctx.held(instance_id) + len(self._queues[instance_id]) + 1
        if profile is None:
            return float("inf")
        memory = self.ctx.fleet.instance(instance_id).gpu_memory_bytes
        batch = profile.batch_size_for(memory, kv_need_tokens(request))
        return assigned / profile.token_throughput_per_s(batch)

    def _push(self, instance_id: str, request: Request) -> None:
        entry = (request.ttft_deadline_at_s, next(self._sequence), request)
        heapq.heappush(self._queues[instance_id], entry)

    def _serve(self, instance_id: str) -> Actions:
        queue = self._queues[instance_id]
        book = self._book
        ids: list[str] = []
        while queue and book.fits(instance_id, queue[0][2]):
            request = heapq.heappop(queue)[2]
            book.admit(instance_id, request)
            ids.append(request.id)
        if ids:
            self._frees_at_s.pop(instance_id, None)
            return (Pull(instance_id, tuple(ids)),)
        return self._preempt_if_needed(instance_id)

    def _preempt_if_needed(self, instance_id: str) -> Actions:
        queue = self._queues[instance_id]
        profile = self.profile_on(instance_id)
        if not queue or profile is None:
            return NO_ACTIONS
        head = queue[0][2]
        now_s = self.now_s()
        admit_s = profile.prefill_s(head.prompt_tokens)
        if now_s + admit_s > head.ttft_deadline_at_s:
            return NO_ACTIONS  # too late either way: no point preempting for it
        if self._next_free_s(instance_id) + admit_s <= head.ttft_deadline_at_s:
            return NO_ACTIONS  # it makes it by waiting
        running = self.ctx.observe(instance_id).active
        if not running:
            return NO_ACTIONS
        victim = max(running, key=lambda r: (self._deadline(r.request_id), r.request_id))
        if self._deadline(victim.request_id) <= head.ttft_deadline_at_s:
            return NO_ACTIONS
        self._preemptions += 1
        actions: tuple[Action, ...] = (
            Evict(instance_id, (victim.request_id,), "shepherd: preempted for deadline"),
        )
        return actions

    def _next_free_s(self, instance_id: str) -> float:
        """When the running request closest to done finishes, at the current decode step
        time; kept until the batch changes (a pull, a finish or an eviction)."""
        cached = self._frees_at_s.get(instance_id)
        if cached is not None:
            return cached
        profile = self.profile_on(instance_id)
        running = self.ctx.observe(instance_id).active
        if not running or profile is None:
            return self.now_s()
        step_s = profile.decode_step_s_at(len(running))
        remaining = min(max(1, r.max_output_tokens - r.output_tokens) for r in running)
        frees_at_s = self.now_s() + remaining * step_s
        self._frees_at_s[instance_id] = frees_at_s
        return frees_at_s

    def _deadline(self, request_id: str) -> float:
        request = self._requests.get(request_id)
        return float("-inf") if request is None else request.ttft_deadline_at_s
