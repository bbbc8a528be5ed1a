"""The live side of the standby tiers' fetches (the decision is qlm/agents/warming.py's, the
same the simulator runs): the control loop notes each request the first time it sees it
queued (its model's recent arrivals and TTFT budgets), and each round names the fetch every
tiered instance that is up should start; the plan it publishes carries them
(`PublishedPlan.notes.standby_fetches`) and each agent starts its own (qlm/agents/agent.py). With no
tiered instance reporting, a round costs one pass over the reports."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence

from qlm.agents.arrival_rates import ArrivalRates
from qlm.agents.warming import fleet_fetches, hosts_of
from qlm.control.plan import PublishedPlan
from qlm.engine.client import EngineClient, StandbyFetcher
from qlm.engine.engine_types import EngineState
from qlm.queue.records import InstanceStatus
from qlm.types import Fleet, Request

log = logging.getLogger("qlm.agent")

WINDOW_S = 60.0  # ArrivalRates' window


class LiveWarming:
    """Arrival rates from the queue, and the fetches they make worth starting."""

    def __init__(self, fleet: Fleet, window_s: float = WINDOW_S) -> None:
        self._fleet = fleet
        self._window_s = window_s
        self._rates = ArrivalRates(window_s)
        self._seen: OrderedDict[str, float] = OrderedDict()  # request id -> arrival, in turn
        self._hosts = hosts_of(fleet, {model for model, _ in fleet.profiles})

    def round(
        self,
        queued: Sequence[Request],
        statuses: Sequence[InstanceStatus],
        up: Collection[str],
        now_s: float,
    ) -> Mapping[str, tuple[str, str | None]]:
        """Instance id -> (model to fetch, model whose place it takes or None), for the
        instances up whose tiers should start a fetch now."""
        reports = [s for s in statuses if s.instance_id in up]
        if not any(s.standby_capacity for s in reports):
            return {}
        self._note(queued, now_s)
        fetches = fleet_fetches(self._fleet, reports, self._rates, now_s, self._hosts)
        return {f.instance_id: (f.model, f.replacing) for f in fetches}

    def _note(self, queued: Sequence[Request], now_s: float) -> None:
        horizon_s = now_s - self._window_s
        new = [r for r in queued if r.id not in self._seen and r.arrival_at_s >= horizon_s]
        for request in sorted(new, key=lambda r: r.arrival_at_s):
            self._seen[request.id] = request.arrival_at_s
            budget_s = request.ttft_deadline_at_s - request.arrival_at_s
            self._rates.arrived(request.model, request.arrival_at_s, budget_s)
        while self._seen and next(iter(self._seen.values())) < horizon_s:
            self._seen.popitem(last=False)


def start_fetch(engine: EngineClient, instance_id: str, plan: PublishedPlan) -> bool:
    """An agent's part: start the fetch the plan names for its instance, unless the engine
    has no tier to fetch into (no `StandbyFetcher`), is loading, fetches already, or holds
    the model (a stale directive: the loop sees the change once the agent reports it)."""
    wanted = plan.notes.standby_fetches.get(instance_id)
    if wanted is None or not isinstance(engine, StandbyFetcher):
        return False
    model, replacing = wanted
    obs = engine.observe()
    busy = obs.fetching_models or obs.state is EngineState.LOADING  # one fetch at a time
    if busy or model == obs.model or model in obs.standby_models:
        return False
    engine.fetch_standby(model, replacing)
    log.info("agent %s: fetching %s into standby (in place of %s)", instance_id, model, replacing)
    return True
