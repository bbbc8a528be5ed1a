"""An agent's engine events as queue writes (`EventWriter`): the live twin of what the
simulator's runner records when its engine model reports the same events.

* a first token marks the request running; token chunks of one request within a round merge
  into one stream event; a finished request's result is recorded exactly once (a result the
  queue refuses, e.g. for a request whose lease went elsewhere, is not counted);
* an abort the agent asked for (`evicting`) requeues the request as evicted; one it did not
  requeues it as a plain retry, until the request has been dispatched `max_dispatches` times,
  when it fails (the engine keeps refusing it);
* a failed engine requeues everything it held; a loaded model ends the load the agent timed
  (`ModelLoads`: the model-load share of each request's wait, a miss cause).

Writes of one kind go out in one call per round, and a batch is flushed before an abort or a
failure, so nothing of an attempt is written after its requeue.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Sequence

from qlm.agents.engine_loads import ModelLoads
from qlm.agents.rounds import AgentCounters, Batch, Chunks, Held, failed_result, finished_result
from qlm.clock import Clock
from qlm.engine.engine_types import (
    Aborted,
    EngineEvent,
    EngineFailed,
    FirstToken,
    ModelLoaded,
    RequestFinished,
    TokenChunk,
)
from qlm.metrics import MetricsHooks
from qlm.output_extras import merge_extras
from qlm.queue.queue_protocol import GlobalQueue

log = logging.getLogger("qlm.agent")


class EventWriter:
    """One agent's event handling; `held` (the requests its engine runs) and `loads` are the
    agent's own, shared."""

    def __init__(
        self,
        instance_id: str,
        queue: GlobalQueue,
        clock: Clock,
        metrics: MetricsHooks,
        counters: AgentCounters,
        held: dict[str, Held],
        loads: ModelLoads,
        max_dispatches: int,
    ) -> None:
        self.instance_id = instance_id
        self.queue = queue
        self.clock = clock
        self.metrics = metrics
        self.counters = counters
        self._held = held
        self._loads = loads
        self.max_dispatches = max_dispatches
        self.evicting: set[str] = set()  # aborts the agent asked for (evictions)

    async def handle(self, events: Sequence[EngineEvent]) -> None:
        """Queue updates for a round's events, batched: token chunks of one request merge
        into one stream event, and each kind goes out in one call; a batch is flushed before
        an abort or failure so that nothing of an attempt is written after its requeue."""
        batch = Batch()
        for event in events:
            if isinstance(event, FirstToken):
                if event.request_id in self._held:
                    batch.running.append((event.request_id, event.at_s))
            elif isinstance(event, TokenChunk):
                self._chunk(event, batch)
            elif isinstance(event, RequestFinished):
                self._finished(event, batch)
            else:
                await self._flush(batch)
                await self._other(event)
        await self._flush(batch)

    async def _other(self, event: EngineEvent) -> None:
        if isinstance(event, Aborted):
            await self._aborted(event)
        elif isinstance(event, EngineFailed):
            await self.requeue(list(self._held), evicted=False)
        elif isinstance(event, ModelLoaded):
            log.info("agent %s: %s loaded in %.1f s", self.instance_id, event.model, event.load_s)
            self._loads.ended(event.model, event.at_s, event.load_s)
            self.metrics.model_loaded(self.instance_id, event.model, event.load_s)

    async def _flush(self, batch: Batch) -> None:
        """The round's marks, token chunks and results, issued together in that order (a
        Redis queue sends them in one round trip: qlm/queue/redis/batching.py)."""
        calls: list[Awaitable[object]] = [
            self.queue.mark_running(rid, self.instance_id, at_s) for rid, at_s in batch.running
        ]
        if batch.chunks:
            calls.append(self.queue.emit_many([c.event(r) for r, c in batch.chunks.items()]))
        ends = [self.queue.complete(r) for r in batch.finished]
        outcomes = await asyncio.gather(*calls, *ends)
        if batch.finished:
            done = [bool(recorded) for recorded in outcomes[len(calls) :]]
            self.counters.completed += sum(done)
            for result, recorded in zip(batch.finished, done, strict=True):
                if recorded:  # a result counts once, like the queue records it
                    self.metrics.request_finished(batch.requests[result.request_id], result)
        batch.clear()

    def _chunk(self, event: TokenChunk, batch: Batch) -> None:
        held = self._held.get(event.request_id)
        if held is None:
            return
        chunks = batch.chunks.get(event.request_id)
        if chunks is None:
            chunks = batch.chunks[event.request_id] = Chunks(held.attempt, held.sent_tokens, 0.0)
        chunks.at_s = event.at_s
        chunks.texts.append(event.text)
        chunks.extras = merge_extras(chunks.extras, event.extras)
        chunks.num_tokens += event.num_tokens
        held.sent_tokens += event.num_tokens
        held.text.append(event.text)

    def _finished(self, event: RequestFinished, batch: Batch) -> None:
        held = self._held.pop(event.request_id, None)
        if held is None:
            return
        batch.requests[event.request_id] = held.request
        batch.finished.append(
            finished_result(held, event, self.instance_id, self._load_wait_s(held))
        )

    def _load_wait_s(self, held: Held) -> float:
        """Of the request's queue wait (arrival to its last dispatch), the time this instance
        spent loading the model it then served it on."""
        request = held.request
        return self._loads.wait_s(request.model, request.arrival_at_s, held.dispatched_at_s)

    async def _aborted(self, event: Aborted) -> None:
        evicted = event.request_id in self.evicting
        self.evicting.discard(event.request_id)
        held = self._held.get(event.request_id)
        if held is None:
            return
        if not evicted and held.attempt >= self.max_dispatches:
            await self._fail(held, event)  # the engine keeps refusing it: stop retrying
        else:
            await self.requeue([event.request_id], evicted=evicted)

    async def _fail(self, held: Held, event: Aborted) -> None:
        del self._held[event.request_id]
        what = f"{event.request_id} failed after {held.attempt} dispatches: {event.reason}"
        log.warning("agent %s: %s", self.instance_id, what)
        result = failed_result(held, event, self.instance_id, self._load_wait_s(held))
        if await self.queue.complete(result):
            self.metrics.request_finished(held.request, result)

    async def requeue(self, request_ids: Sequence[str], *, evicted: bool) -> None:
        held = {rid: self._held.pop(rid).request for rid in request_ids if rid in self._held}
        moved = await self.queue.requeue(self.instance_id, request_ids, evicted, self.clock.now_s())
        self.counters.requeued += len(moved)
        if evicted:
            self.counters.evictions += len(moved)
            self.metrics.evicted(self.instance_id, [held[r] for r in moved if r in held])
