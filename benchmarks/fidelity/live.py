"""The live run: the workload's requests enqueued at their arrival times into the in-process
control plane on real vLLM engines, the plans it published (and what the estimator predicted
from each), and each request's times from the queue's records."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Sequence
from dataclasses import replace

from benchmarks.fidelity.outcomes import LiveRun, Outcome, Prediction
from benchmarks.fidelity.settings import RunSpec
from qlm.clock import WallClock
from qlm.config import QlmConfig
from qlm.control.plan import PublishedPlan
from qlm.engine.vllm.metrics import parse_metrics
from qlm.estimator import make_estimator
from qlm.grouping.group import RequestGroup
from qlm.serve.runtime import Plane
from qlm.types import Request


async def engine_decode_totals(plane: Plane) -> tuple[float, float]:
    """Summed over the plane's vLLM engines: seconds of decoding and decode steps taken by
    finished requests (vLLM's decode-time histogram; generated tokens minus one per request)."""
    import httpx

    from qlm.engine.vllm.metrics import DECODE_TIME, histogram_totals

    seconds = steps = 0.0
    async with httpx.AsyncClient(timeout=30.0, trust_env=False) as http:
        for engine in plane.engines:
            url = getattr(engine, "base_url", None)
            if url is None:
                continue
            with contextlib.suppress(httpx.HTTPError):
                text = (await http.get(f"{url}/metrics")).text
                total = histogram_totals(text)[DECODE_TIME]
                generated = parse_metrics(text).generation_tokens_total
                seconds += total.sum_s
                steps += generated - total.count
    return seconds, steps


class PlanObserver:
    """Watches the published plans. For each request, the first plan that holds it: when that
    plan was made, the predicted wait annotated on the request (re-plans only), and the
    estimator's mean and percentile TTFT recomputed from that plan (every request, including
    those an arrival inserted into a planned group without a re-plan)."""

    def __init__(self, plane: Plane, config: QlmConfig, requests: dict[str, Request]) -> None:
        self.plane = plane
        self.requests = requests
        self.estimator = make_estimator(config.estimator, plane.fleet)
        self.predictions: dict[str, Prediction] = {}
        self.solves: list[float] = []
        self._epoch = -1
        self._replans = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.observe()
            await asyncio.sleep(0.02)

    async def observe(self) -> None:
        loop = self.plane.loop
        if loop is not None and loop.counters.replans != self._replans:
            self._replans = loop.counters.replans
            self.solves.append(loop.counters.last_solve_s)
        plan = await self.plane.queue.current_plan()
        if plan is None or plan.epoch == self._epoch:
            return
        self._epoch = plan.epoch
        await self._record(plan)

    async def _record(self, plan: PublishedPlan) -> None:
        statuses = {s.instance_id: s for s in await self.plane.queue.instances()}
        for instance_id, group_ids in plan.queues.items():
            queue = []
            for gid in group_ids:
                members = [
                    self.requests[r] for r in plan.groups[gid].request_ids if r in self.requests
                ]
                if members:
                    queue.append(RequestGroup.of(gid, members))
            fresh = {r for g in queue for r in g.request_ids if r not in self.predictions}
            if not fresh:
                continue
            status = statuses.get(instance_id)
            instance = self.plane.fleet.instance(instance_id)
            if status is not None:
                instance = replace(instance, loaded_model=status.model)
            busy = 0.0 if status is None else status.busy_s
            try:
                est = self.estimator.estimate_queue(queue, instance, busy)
            except ValueError:
                continue
            for rid, mean, p in zip(est.request_ids, est.ttft_mean_s, est.ttft_p_s, strict=True):
                if rid in fresh:
                    self.predictions[rid] = Prediction(
                        plan_s=plan.created_at_s,
                        ttft_mean_s=float(mean),
                        ttft_p_s=float(p),
                        annotated_mean_s=plan.forecast.predicted_wait_s.get(rid),
                    )


async def live_run(
    plane: Plane, run: RunSpec, requests: Sequence[Request], qlm: QlmConfig
) -> LiveRun:
    clock = WallClock()
    slo = qlm.slo_class_map()
    by_id: dict[str, Request] = {}
    observer = PlanObserver(plane, qlm, by_id)
    stop = asyncio.Event()
    watcher = asyncio.create_task(observer.run(stop))
    decode0 = await engine_decode_totals(plane)
    swaps0 = sum(a.counters.swaps for a in plane.agents)
    evictions0 = sum(a.counters.evictions for a in plane.agents)
    replans0 = plane.loop.counters.replans if plane.loop else 0
    t0 = clock.now_s() + 0.5
    enqueued: list[Request] = []
    for r in requests:
        delay = t0 + r.arrival_at_s - clock.now_s()
        if delay > 0:
            await asyncio.sleep(delay)
        live = Request.create(
            r.id, r.model, r.prompt_tokens, r.max_output_tokens, slo[r.slo_class], clock.now_s()
        )
        by_id[live.id] = live
        await plane.queue.enqueue(live)
        enqueued.append(live)
    await _wait_terminal(plane, [r.id for r in enqueued], run.duration_s + 600)
    await observer.observe()
    stop.set()
    await watcher
    outcomes = [await _live_outcome(plane, r, t0) for r in enqueued]
    decode1 = await engine_decode_totals(plane)
    decode_steps = decode1[1] - decode0[1]
    engine_itl = (decode1[0] - decode0[0]) / decode_steps if decode_steps > 0 else math.nan
    predictions = {rid: replace(p, plan_s=p.plan_s - t0) for rid, p in observer.predictions.items()}
    shifted = [_shift(r, t0) for r in enqueued]
    return LiveRun(
        outcomes=outcomes,
        requests=shifted,
        predictions=predictions,
        solve_s=observer.solves,
        swaps=sum(a.counters.swaps for a in plane.agents) - swaps0,
        evictions=sum(a.counters.evictions for a in plane.agents) - evictions0,
        replans=(plane.loop.counters.replans if plane.loop else 0) - replans0,
        engine_itl_s=engine_itl,
        swap_events=_swap_events(plane, t0),
    )


def _swap_events(plane: Plane, t0: float) -> list[tuple[float, str, str, str]]:
    """The swaps the plane's recorder saw start and finish since the run began (`t0`, the
    same wall clock), in order, times from `t0`: when a swap was decided and how long its
    load took, which the counts alone do not tell apart."""
    events = [] if plane.metrics is None else list(plane.metrics.events)
    return [
        (e.at_s - t0, e.kind, e.instance_id, e.detail)
        for e in events
        if e.kind in ("swap", "swapped") and e.at_s >= t0 - 0.5
    ]


async def _wait_terminal(plane: Plane, ids: list[str], timeout_s: float) -> None:
    async def done() -> None:
        pending = list(ids)
        while pending:
            records = await asyncio.gather(*(plane.queue.get(i) for i in pending))
            pending = [
                i
                for i, rec in zip(pending, records, strict=True)
                if rec is None or not rec.state.is_terminal
            ]
            if pending:
                await asyncio.sleep(0.5)

    await asyncio.wait_for(done(), timeout_s)


async def _live_outcome(plane: Plane, request: Request, t0: float) -> Outcome:
    record = await plane.queue.get(request.id)
    assert record is not None
    result = record.result

    def rel(at: float | None) -> float | None:
        return None if at is None else at - t0

    first = None if result is None else result.first_token_at_s
    finish = None if result is None else result.finished_at_s
    completed = result is not None and str(result.state) == "completed"
    met = (
        completed
        and first is not None
        and first <= request.ttft_deadline_at_s
        and (
            request.completion_deadline_at_s is None
            or (finish is not None and finish <= request.completion_deadline_at_s)
        )
    )
    return Outcome(
        id=request.id,
        slo_class=request.slo_class,
        model=request.model,
        arrival_s=request.arrival_at_s - t0,
        dispatch_s=rel(None if result is None else result.dispatched_at_s),
        first_token_s=rel(first),
        finish_s=rel(finish) if completed else None,
        met_slo=bool(met),
        evictions=record.evictions,
        instance=None if result is None else result.instance_id,
    )


def _shift(r: Request, t0: float) -> Request:
    return replace(
        r,
        arrival_at_s=r.arrival_at_s - t0,
        ttft_deadline_at_s=r.ttft_deadline_at_s - t0,
        completion_deadline_at_s=None
        if r.completion_deadline_at_s is None
        else r.completion_deadline_at_s - t0,
    )


async def settle(plane: Plane) -> None:
    """Let the engines go idle between runs (the next run starts from an idle fleet)."""
    for _ in range(200):
        if all(not a.engine.observe().requests for a in plane.agents):
            return
        await asyncio.sleep(0.1)
