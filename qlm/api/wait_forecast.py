"""The API's side of the one wait predictor: `Dispatcher.predict` (qlm/agents/decision.py), the
function the simulator grades, run over the live plane's view of the queue and the fleet.

A request's forecast is its start in its model's dispatch schedule (Moore-Hodgson over the
instances serving the model, seen as one machine), moved back by the recent arrivals' work
that will be due before it (qlm/estimator/passing.py), plus the engine work that blocks its
class, plus its prefill: what the agents serving the model will do with it, as far as the API can
know. Where the API's inputs come from, and how stale they may be:

* the queue: every queued request (`GlobalQueue.queued`), re-read at most every
  `api.plan_refresh_s`, plus each request this API admitted since (its own admissions are
  known at once; another API replica's show at the next read). Requests pulled since the last
  read still count as waiting until then;
* the fleet: each instance's last status report (`PeerReports`: its model, whether it is
  loading, its standby tier, the start blocks of its admitted work), at most about two report
  periods old (`ReportedFleet` with no engine of its own);
* the profiles and instances: the fleet file's, as the agents and the simulator read them.

* the arrivals whose work will pass a queued request (`Dispatcher.passing`): those this API
  admits, and another replica's as they show queued at a read (one that was pulled before
  a read is missed: with several replicas the passing work is a lower bound).

The simulator's forecast (qlm/sim/policies/qlm_dispatch.py `SimDispatch.predict`) is made at
the same moment, as a request is queued, over exact inputs.

The forecast's bound for nine in ten (`band`, qlm/estimator/forecast_band.py) learns from this
API's own forecasts: they await their first token in the band, and the oldest `WATCHED` of
each class are read back at each refresh (`GlobalQueue.get_many`); each that has finished gives its
score (how many times later than its forecast its first token came) and its bound's outcome,
and one whose bound passed with no first token counts as a miss at once (`expire`). The
simulator learns the same way from every request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from qlm.agents.decision import Dispatcher, Forecast
from qlm.agents.queued import QueuedItem
from qlm.agents.reported_fleet import PeerReports, ReportedFleet
from qlm.clock import Clock
from qlm.estimator.forecast_band import ForecastBand
from qlm.queue.queue_protocol import GlobalQueue
from qlm.types import Fleet, Request

NO_INSTANCE = ""  # the API is no instance: every instance is seen as reported
# Forecasts read back for the bound at a refresh, per class (the oldest awaiting, the likeliest
# to have ended): per class, so that a rare class with long waits (wc-quick's batch-1: one
# request in 35) is not crowded out by a frequent one (one cap for all: no batch-1 bound on the
# wc-quick replays). At most AWAITED_KEPT per class await (past it the oldest is dropped). A
# class whose oldest forecasts wait long delays the reading of newer ones that ended: their
# holds count late (a miss counts at once, by its bound's time), which errs towards a wider bound.
WATCHED = 256
AWAITED_KEPT = 4096
NOTED_KEPT = 4096  # ids noted as arrivals kept at least (forgotten past twice the window)


class QueueForecaster:
    """Forecasts over the queue and the reports, re-read at most every `refresh_s`."""

    def __init__(
        self,
        queue: GlobalQueue,
        fleet: Fleet,
        priority: Mapping[str, int],
        clock: Clock,
        refresh_s: float,
        report_every_s: float,
    ) -> None:
        self._queue = queue
        self._fleet = fleet
        self._priority = dict(priority)
        self._clock = clock
        self._refresh_s = refresh_s
        self.decision = Dispatcher(fleet, priority)
        self._peers = PeerReports(NO_INSTANCE, report_every_s)
        self._read_at_s = -math.inf
        self.band = ForecastBand(awaited_per_class=AWAITED_KEPT)
        self._noted: dict[str, float] = {}  # ids noted as arrivals: their arrival time
        self._forget_past = NOTED_KEPT

    async def forecast(self, request: Request) -> Forecast | None:
        """The request's forecast as it joins the queue (None: the decision makes none: no
        instance reported serving its model, or its class's window ends before it)."""
        await self._refresh()
        item = QueuedItem.of(request)
        self.decision.queues.add(item, request.model)
        # its work among the arrivals that pass queued requests (a refused one stays counted
        # for the window: refusals are rare next to arrivals)
        self._note(request.model, item)
        view = ReportedFleet(self._fleet, NO_INSTANCE, None, self._priority, self._peers.reports)
        forecast = self.decision.predict(view, item, request.model, self._clock.now_s())
        if forecast is not None and forecast.first_token_s is not None:
            first_s = forecast.first_token_s
            self.band.bound(request.id, request.slo_class, request.arrival_at_s, first_s)
        return forecast

    def bound_s(self, request_id: str) -> float | None:
        """The bound for nine in ten given with the request's forecast (None: none)."""
        return self.band.given(request_id)

    def forget(self, request_id: str) -> None:
        """A request forecast but not admitted after all (refused, or the queue is full)."""
        self.decision.queues.remove((request_id,))
        self.band.forget(request_id)

    def _note(self, model: str, item: QueuedItem) -> None:
        """A request seen for the first time: an arrival, for the work that passes queued
        requests (`Dispatcher.passing`)."""
        if item.request_id not in self._noted:
            self._noted[item.request_id] = item.arrival_at_s
            self.decision.arrived(model, item)

    def _forget_noted(self) -> None:
        """Forget the ids noted before twice the arrivals' window (a queue read notes none
        older than the window), seldom (amortised)."""
        if len(self._noted) <= self._forget_past:
            return
        horizon_s = self._clock.now_s() - 2 * self.decision.arrivals.window_s
        self._noted = {rid: at_s for rid, at_s in self._noted.items() if at_s >= horizon_s}
        self._forget_past = max(NOTED_KEPT, 2 * len(self._noted))

    async def _learn(self) -> None:
        """Each awaited forecast whose request has ended: its score and its bound's outcome;
        a miss for each whose bound passed with no first token."""
        self.band.expire(self._clock.now_s())
        ids = [rid for _, rid in self.band.awaited(WATCHED)]
        records = await self._queue.get_many(ids)
        for rid, record in zip(ids, records, strict=True):
            if record is None:
                self.band.forget(rid)
            elif record.state.is_terminal:
                result = record.result
                if result is not None and result.first_token_at_s is not None:
                    self.band.first_token(rid, result.first_token_at_s)
                else:
                    self.band.forget(rid)

    async def _refresh(self) -> None:
        mono_s = self._clock.monotonic_s()
        if mono_s - self._read_at_s < self._refresh_s:
            return
        self._read_at_s = mono_s
        await self._peers.refresh(self._queue, self._clock.now_s())
        await self._learn()
        queues = self.decision.queues
        by_model: dict[str, dict[str, QueuedItem]] = {m: {} for m in queues.models()}
        fresh = []
        # Another replica's admission, still queued and within the arrivals' window (older
        # ones are past what the rates count, and may be ids forgotten here: never again).
        recent_s = self._clock.now_s() - self.decision.arrivals.window_s
        for request in await self._queue.queued():
            items = by_model.setdefault(request.model, {})
            known = queues.items(request.model).get(request.id)
            items[request.id] = known if known is not None else QueuedItem.of(request)
            if request.id not in self._noted and request.arrival_at_s >= recent_s:
                fresh.append((request.model, items[request.id]))
        for model, item in sorted(fresh, key=lambda f: (f[1].arrival_at_s, f[1].request_id)):
            self._note(model, item)
        self._forget_noted()
        for model, items in by_model.items():
            queues.sync(model, items)
