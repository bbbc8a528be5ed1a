"""The prefill/decode split in the simulator (Prophet's and DistServe's disaggregation; the P/D
pools of llm-d, Dynamo and AIBrix): instances with `role: prefill` make a request's first token
and hand its KV to an instance with `role: decode` (qlm/types.py `InstanceRole`).

Question answered: after a prefill instance made a request's first token, which instance
decodes it and when does it get there?

* **Where.** The policy's `decode_target` (qlm/sim/policies/policy_base.py) picks among the
  candidates: the ready instances serving the request's model with role decode, or, when there
  are none, those with role both. The default rule, `roomiest_decode`, takes the one with the
  most free KV after the request's own (then the fewest running sequences): decode time grows
  with the batch and its context, and a decode instance without room makes it wait (its
  engine admits it when room frees, before nothing: it queues like any request).
* **When.** The KV travels at the slower end's link (`Instance.kv_link_bytes_per_s`, the fleet
  file's `kv_link_gb_per_s`): `kv_tokens * kv_bytes_per_token / bytes_per_s`. The prefill
  engine frees the KV at once (vLLM's connectors hold it until the decode side has pulled it:
  this model gives the prefill side that memory back one transfer early).
* **If it cannot land.** No candidate (or the policy answers None), or the target loaded
  another model meanwhile: the request returns to the global queue as an interrupted one
  (its first token stays counted: a requeued stream resumes, qlm/queue).

The live plane's engines prefill and decode their own requests: `qlm serve` refuses any other
role (qlm/config/serve_config.py), so this rule has no live twin to keep in step with yet.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import partial

from qlm.engine.engine_types import (
    Aborted,
    EngineEvent,
    EngineObservation,
    EngineState,
    HandedOff,
)
from qlm.sim.events import EventLoop, Priority
from qlm.sim.tracking import Slot, Track
from qlm.types import Fleet, Instance, InstanceRole, Request

DecodeTarget = Callable[[Request, int, Sequence[EngineObservation]], "str | None"]


def transfer_s(
    kv_tokens: int, kv_bytes_per_token: int, sender: Instance, receiver: Instance
) -> float:
    """Seconds the KV of `kv_tokens` tokens takes from sender to receiver."""
    bytes_per_s = min(sender.kv_link_bytes_per_s, receiver.kv_link_bytes_per_s)
    return kv_tokens * kv_bytes_per_token / bytes_per_s


def roomiest_decode(
    request: Request, kv_tokens: int, candidates: Sequence[EngineObservation]
) -> str | None:
    """The candidate with the most free KV once it holds this request's (then the fewest
    requests, then fleet order). One without room for it now still takes it: the request
    waits in its engine's queue until room frees, as a decode instance of vLLM's P/D
    connectors queues a transfer; None only when there is no candidate."""
    best: tuple[int, int, int] | None = None
    chosen: str | None = None
    for k, obs in enumerate(candidates):
        free = obs.kv_capacity_tokens - obs.kv_used_tokens - kv_tokens
        key = (-free, len(obs.requests), k)
        if best is None or key < best:
            best, chosen = key, obs.instance_id
    return chosen


def decode_candidates(slots: Mapping[str, Slot], model: str) -> list[EngineObservation]:
    """Ready instances serving `model` that decode: role decode, else role both."""
    ready = [
        s
        for s in slots.values()
        if s.model == model and not s.loading and s.instance.role is not InstanceRole.PREFILL
    ]
    decoders = [s for s in ready if s.instance.role is InstanceRole.DECODE] or ready
    return [s.engine.observe() for s in decoders]


class Handoffs:
    """Carries handed-off requests from prefill to decode engines for one simulation run,
    on the run's paths: `abort(slot, event, requeued)` returns a request its slot holds to
    the global queue (the run's abort path), `requeued_now(requests)` tells the policy
    outside an engine's events, `poll(slot)` makes the run poll an engine now."""

    def __init__(
        self,
        slots: Mapping[str, Slot],
        loop: EventLoop,
        fleet: Fleet,
        choose: DecodeTarget,
        abort: Callable[[Slot, EngineEvent, list[Request]], None],
        requeued_now: Callable[[list[Request]], None],
        poll: Callable[[Slot], None],
    ) -> None:
        self._slots, self._loop, self._fleet, self._choose = slots, loop, fleet, choose
        self._abort, self._requeued_now, self._poll = abort, requeued_now, poll

    def on_handed_off(self, slot: Slot, event: EngineEvent, requeued: list[Request]) -> None:
        """Send the request on to a decode instance, or back to the queue when none can take
        it now."""
        assert isinstance(event, HandedOff)
        track = slot.held.get(event.request_id)
        if track is None:
            return  # evicted meanwhile: nothing to carry
        request = track.request
        candidates = decode_candidates(self._slots, request.model)
        target_id = self._choose(request, event.kv_tokens, candidates) if candidates else None
        if target_id is None:
            reason = "no decode instance of its model could take its KV"
            self._abort(slot, Aborted(event.request_id, event.at_s, reason), requeued)
            return
        target = self._slots[target_id]
        profile = self._fleet.profile(request.model, target.instance)
        assert profile is not None  # a candidate serves the model
        delay_s = transfer_s(
            event.kv_tokens, profile.kv_bytes_per_token, slot.instance, target.instance
        )
        del slot.held[event.request_id]
        slot.evicting.discard(event.request_id)
        track.holder = target
        arrive = partial(self._deliver, target, track, event)
        self._loop.schedule(event.at_s + delay_s, Priority.ENGINE, arrive)

    def _deliver(self, target: Slot, track: Track, event: HandedOff) -> None:
        target.held[event.request_id] = track
        observed = target.engine.observe()
        if observed.state is not EngineState.READY or observed.model != track.request.model:
            reason = "its decode instance changed models while its KV travelled"
            requeued: list[Request] = []
            self._abort(target, Aborted(event.request_id, self._loop.now_s(), reason), requeued)
            self._requeued_now(requeued)
            return
        target.engine.receive(track.request, event)
        self._poll(target)
