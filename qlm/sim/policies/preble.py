"""`preble`, after Preble's E2 global scheduler (Srivatsa et al., ICLR 2025): each arrival is
sent at once to one engine, which queues it (FCFS, continuous batching, preemption by
recompute), chosen for prefix reuse and load together.

* Exploit: when the longest prefix some instance holds (the router's `PrefixIndex`) is longer
  than the rest of the prompt, send it to the instance holding it (ties: least load cost).
* Explore: otherwise, to the instance with the least load cost L + M + P, all in that
  instance's seconds by its profile: L, the prefill (of the part it did not hold) and decode
  (at the mean output length it finished in the window) of the requests sent to it in the last
  `window_s` (Preble's H, 3 minutes); M, the recompute time of the prefix blocks it would
  evict to hold this prompt, each weighted by the share of its requests in the window that
  used the block; P, this request's prefill of what it does not hold.
* Rebalance: an exploit whose instance would carry more than `balance_ratio` times the load of
  the lightest instance, each counted with the request on it (its load L plus the request's
  prefill of what it does not hold and decode), goes to the lightest instead (Preble's Th_bal,
  "deduced from profiling" in the paper, 2 here; counting the request on both sides keeps a
  lone busy instance beside an idle one from rebalancing every exploit).

* Prefill/decode balance (Preble's section 3.2, checked before the load cost): while some
  instance has prompts waiting for their prefill, a request about to be explored goes to the
  least load cost among the instances not prefilling (`not_prefilling`: those running only
  decodes, or nothing, with a free sequence slot and KV room for the prompt): a decoding batch
  leaves compute idle that a prefill uses almost for free, which the window's load cost,
  blind to the batches running now, does not see. With no instance prefilling, or none free
  of it, the load cost decides among all. Requests an engine dropped (`on_requeued`) skip it:
  they are routed together, before any is placed, and would all read the same batches.
* Hot prefixes are replicated by the rebalance: an exploit sent to the lightest instance
  caches the prefix there, and later exploits pick the least loaded of its holders, so a
  prefix whose traffic outgrows one instance is held and served by as many as its load needs
  (Preble's autoscaling splits the subtree by load; here the split follows each request's
  load comparison).
* Local scheduler: its engines admit waiting requests by Preble's priority groups of prefix-
  cache hit share (`engine_settings`: waiting_order prefix-groups, whatever the scenario's
  engine section says; qlm/engine/model/scheduler.py).

Models stay where they were loaded; no swaps, no eviction.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from qlm.agents.actions import Pull
from qlm.agents.dispatch import PoolMember
from qlm.engine.engine_types import EngineEvent, EngineObservation, RequestFinished
from qlm.prefixes.index import PrefixIndex
from qlm.sim.policies.policy_base import NO_ACTIONS, SIM_POLICIES, Actions, BasePolicy, SimContext
from qlm.types import Request

WINDOW_S = 180.0


@dataclass(slots=True)
class _Window:
    """What one instance was sent, and finished, in the last window."""

    member: PoolMember
    sent: deque[tuple[float, float, int, tuple[int, ...]]] = field(default_factory=deque)
    prefill_s: float = 0.0  # sum over sent: prefill of the part not held
    prompt_tokens: int = 0  # sum over sent
    keys: Counter[int] = field(default_factory=Counter)  # sent requests using each block
    finished: deque[tuple[float, int]] = field(default_factory=deque)  # (at, output tokens)
    output_tokens: int = 0  # sum over finished

    def expire(self, now_s: float, window_s: float) -> None:
        while self.sent and self.sent[0][0] < now_s - window_s:
            _, prefill_s, prompt, keys = self.sent.popleft()
            self.prefill_s -= prefill_s
            self.prompt_tokens -= prompt
            self.keys.subtract(keys)
        while self.finished and self.finished[0][0] < now_s - window_s:
            self.output_tokens -= self.finished.popleft()[1]

    def load_s(self) -> float:
        """L: prefill and decode of what it was sent in the window."""
        n = len(self.sent)
        if not n:
            return 0.0
        output = self.output_tokens // len(self.finished) if self.finished else 0
        total_s, prefill_s = self.member.cost_s(self.prompt_tokens // n, output)
        return self.prefill_s + n * (total_s - prefill_s)


@SIM_POLICIES.register("preble")
class PreblePolicy(BasePolicy):
    name = "preble"
    engine_settings: Mapping[str, object] = MappingProxyType({"waiting_order": "prefix-groups"})

    def __init__(
        self, window_s: float = WINDOW_S, balance_ratio: float = 2.0, pd_balance: bool = True
    ) -> None:
        super().__init__()
        self.window_s = window_s
        self.balance_ratio = balance_ratio
        self.pd_balance = pd_balance  # the prefill/decode shortcut for explored requests
        self._pools: dict[str, list[str]] = {}
        self._windows: dict[str, _Window] = {}
        self._index = PrefixIndex()

    def start(self, ctx: SimContext) -> Actions:
        super().start(ctx)
        for instance in ctx.fleet.instances:
            model = ctx.model_of(instance.id)
            profile = ctx.fleet.profile(model, instance) if model is not None else None
            if model is None or profile is None:
                continue
            kv_tokens = ctx.observe(instance.id).kv_capacity_tokens
            self._pools.setdefault(model, []).append(instance.id)
            member = PoolMember(profile, kv_tokens, ctx.max_num_seqs(instance.id))
            self._windows[instance.id] = _Window(member)
            self._index.add_instance(instance.id, kv_tokens)
        return NO_ACTIONS

    def on_arrival(self, request: Request) -> Actions:
        return self._route(request, self.pd_balance)

    def on_requeued(self, requests: Sequence[Request]) -> Actions:
        """Requests an engine dropped on its own are routed again, like new arrivals, but
        without the prefill/decode balance (all are routed before any is placed)."""
        return tuple(a for r in requests for a in self._route(r, pd_balance=False))

    def _route(self, request: Request, pd_balance: bool) -> Actions:
        pool = self._pools.get(request.model)
        if not pool:
            return NO_ACTIONS
        now_s = self.now_s()
        for instance_id in pool:
            self._windows[instance_id].expire(now_s, self.window_s)
        target = self._choose(pool, request, pd_balance)
        self._send(target, request, now_s)
        return (Pull(target, (request.id,)),)

    def on_engine_events(self, instance_id: str, events: Sequence[EngineEvent]) -> Actions:
        window = self._windows.get(instance_id)
        if window is not None:
            for event in events:
                if isinstance(event, RequestFinished):
                    window.finished.append((event.at_s, event.output_tokens))
                    window.output_tokens += event.output_tokens
        return NO_ACTIONS

    def _choose(self, pool: Sequence[str], request: Request, pd_balance: bool) -> str:
        matched = self._index.best(pool, request.prefix)
        cached = max(matched.values())
        costs = {i: self._load_cost(i, request, matched[i]) for i in pool}
        if cached > request.prompt_tokens - cached:  # exploit
            holders = [i for i in pool if matched[i] == cached]
            target = min(holders, key=costs.__getitem__)
            after = {i: self._load_with(i, request, matched[i]) for i in pool}
            lightest = min(pool, key=after.__getitem__)
            if after[target] > self.balance_ratio * after[lightest]:
                return lightest
            return target
        if pd_balance:  # explore: instances free of prefills first, while another prefills
            free = not_prefilling([self.ctx.observe(i) for i in pool], request.prompt_tokens)
            if free:
                return min(free, key=costs.__getitem__)
        return min(pool, key=costs.__getitem__)

    def _load_with(self, instance_id: str, request: Request, matched: int) -> float:
        """L with the request on the instance: its prefill of what it does not hold and its
        decode at the window's mean output."""
        window = self._windows[instance_id]
        missed = request.prompt_tokens - matched
        output = window.output_tokens // len(window.finished) if window.finished else 0
        total_s, prefill_s = window.member.cost_s(request.prompt_tokens, output)
        return window.load_s() + window.member.profile.prefill_s(missed) + total_s - prefill_s

    def _load_cost(self, instance_id: str, request: Request, matched: int) -> float:
        window = self._windows[instance_id]
        profile = window.member.profile
        missed = request.prompt_tokens - matched
        eviction_s = 0.0
        sent = len(window.sent)
        for key, tokens in self._index.evicted_by(instance_id, missed):
            share = window.keys[key] / sent if sent else 0.0
            eviction_s += profile.prefill_s(tokens) * share
        return window.load_s() + eviction_s + profile.prefill_s(missed)

    def _send(self, instance_id: str, request: Request, now_s: float) -> None:
        window = self._windows[instance_id]
        matched = self._index.matched_tokens(instance_id, request.prefix)
        prefill_s = window.member.profile.prefill_s(request.prompt_tokens - matched)
        keys = tuple(block.key for block in request.prefix)
        window.sent.append((now_s, prefill_s, request.prompt_tokens, keys))
        window.prefill_s += prefill_s
        window.prompt_tokens += request.prompt_tokens
        window.keys.update(keys)
        self._index.record(instance_id, request.prefix)


def not_prefilling(observations: Sequence[EngineObservation], prompt_tokens: int) -> list[str]:
    """Preble's prefill/decode balance for a request about to be explored: while some
    instance has prompts waiting for their first token, the instances with none (running only
    decodes, or nothing) that have a free sequence slot and KV room for `prompt_tokens`, in
    the order given; none while no instance prefills (the batches are balanced)."""
    if not any(any(not r.started for r in o.active) for o in observations):
        return []
    return [
        o.instance_id
        for o in observations
        if o.free_slots > 0
        and o.free_kv_tokens >= prompt_tokens
        and all(r.started for r in o.active)
    ]
