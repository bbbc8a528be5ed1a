"""The one dispatch decision both planes run: what an instance serves next, and whether it
follows the plan to another model.

`Dispatcher` holds the decision's state (the queue by model with each pool's schedule, the
recent arrivals, pool prices: caches, no I/O) and answers for any instance from a `FleetView`,
the declared input of everything the decision reads besides the queue. The simulator's `qlm`
policy (qlm/sim/policies/qlm_dispatch.py) and the live agent (qlm/agents/live_queue.py, called
by qlm/agents/agent.py) each build a `FleetView` and carry out the answer; no rule lives on one
side only. Where the live plane cannot know a thing exactly, its view says how it knows it
(qlm/agents/README.md, "Inputs and where each plane gets them").

The rules, in order:

1. `follows`: an instance follows its plan to another model only when the plan's head is of
   another model, the plan does not come back to its model while it has queued work
   (`dispatch.follows_swap`), and the swap keeps more promises than it breaks (`swap_pays`).
1b. Otherwise, with nothing of its model queued, it wakes a model asleep in its tier that has
   queued requests and no instance, when that pays (qlm/agents/standby_rules.py).
2. Otherwise it serves its model's dispatch queue: `schedule` (Moore-Hodgson over the model's
   pool, the instances serving it, seen as one machine; each class's due times shifted by
   the engine work that blocks its next first token) cut by `dispatch.dispatch_groups`.

The same schedule is the wait predictor (`predict`): a request's predicted time to first token
is its start in that schedule, moved back by the work of later arrivals that will be due
before it (qlm/estimator/passing.py: the schedule holds only the requests queued now), plus
the engine work blocking its class, plus its prefill; past its deadline, a predicted miss. The
simulator grades it (qlm/sim/report/prediction.py) and the API returns it to clients
(qlm/api/wait_estimate.py), each over its own `FleetView`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from qlm.agents.arrival_rates import ArrivalRates, Side
from qlm.agents.dispatch import PoolRate, Schedule, follows_swap
from qlm.agents.drain import start_blocks_by_rank
from qlm.agents.fleet_view import FleetView
from qlm.agents.model_queues import ModelQueues
from qlm.agents.queued import QueuedGroup, QueuedItem
from qlm.agents.standby_rules import cold_drop_loss
from qlm.engine.engine_types import EngineObservation
from qlm.estimator.passing import PassingRates, start_with_passing
from qlm.perf.profile import Profile
from qlm.types import Fleet

# How long the recent arrivals' work rates stand before they are priced again (a 60 s
# window's rates barely move in a second; a forecast is made at every arrival).
PASSING_REFRESH_S = 1.0


def engine_blocks(
    obs: EngineObservation, profile: Profile, priority: Mapping[str, int]
) -> tuple[float, dict[str, float]]:
    """`FleetView.blocks_of` of one engine from its observation: the profile's prefill speed,
    and per class how long its admitted work delays a new request's first token."""
    by_rank = start_blocks_by_rank(
        obs, profile, lambda r: priority.get(r.slo_class, 0), priority.values()
    )
    return profile.prefill_tokens_per_s, {name: by_rank[rank] for name, rank in priority.items()}


@dataclass(frozen=True, slots=True)
class Forecast:
    """A queued request's predicted time to first token, in seconds from its arrival (None:
    the schedule drops it, a predicted miss)."""

    first_token_s: float | None


def outweighs(gained: float, lost: float) -> bool:
    """Whether a swap's promises kept outnumber those it breaks by more than the counts'
    noise: one standard deviation of the difference of two Poisson counts of these means.
    The gate is asked at every event, and a swap taken the first time noise favours it is
    taken too often (a tail model's burst and a busy model's lull line up by chance)."""
    return gained - lost > math.sqrt(max(gained, 0.0) + max(lost, 0.0))


class Dispatcher:
    """The decision's state across calls (one per simulated fleet, one per live agent)."""

    def __init__(
        self,
        fleet: Fleet,
        priority: Mapping[str, int],
        *,
        wake_for_backlog: bool = True,
        max_jobs: int = 1024,
    ) -> None:
        self.fleet = fleet
        self.priority = dict(priority)
        self.wake_for_backlog = wake_for_backlog  # `swap_pays` counts `backlog_risk`
        self.queues = ModelQueues(max_jobs)
        self.arrivals = ArrivalRates()
        self._rates: dict[tuple[str, ...], PoolRate] = {}
        # (model, *pool) -> (when priced, the recent arrivals' work rates over the pool)
        self._passing: dict[tuple[str, ...], tuple[float, PassingRates]] = {}

    def arrived(self, model: str, item: QueuedItem) -> None:
        """A new request of `model`: the recent arrivals `swap_pays` (their TTFT budgets)
        and `predict` (their work) read."""
        budget_s = item.ttft_deadline_at_s - item.arrival_at_s
        self.arrivals.arrived(model, item.arrival_at_s, budget_s, item)

    # --- rule 1: follow the plan to another model? -------------------------------------------

    def follows(
        self, view: FleetView, instance_id: str, planned: Sequence[QueuedGroup], now_s: float
    ) -> bool:
        """Whether the instance serves its virtual queue `planned` (a swap to its head's
        model, or an empty instance's first load) rather than its model's dispatch queue."""
        model = view.model_of(instance_id)
        count = 0 if model is None else self.queues.count(model)
        return follows_swap(
            model,
            planned,
            count,
            lambda: self.swap_pays(view, planned[0].model, instance_id, now_s),
        )

    def swap_pays(self, view: FleetView, target: str, instance_id: str, now_s: float) -> bool:
        """Whether swapping the instance to `target` keeps more promises than it breaks (no
        swap on a whim).

        Broken (`_lost`): the requests of its own model that its pool keeps with it and not
        without it, plus, when the instance is its model's last, the arrivals of that model
        expected while it is away that cannot wait that long (`ArrivalRates.at_risk`). Away
        is the target's load, the stay there, and the way back (a wake when the instance has
        a standby tier for the model to sleep in, a cold load when not), and the requests of
        sleeping models whose only warm copy the swap sends cold from the instance's full
        tier (`cold_drop_loss`, qlm/agents/standby_rules.py). The stay: beside
        other instances of the target it helps through a backlog and is free to come back
        (none counted); alone on the target it carries all the target's traffic, and a move
        is worth making only for a stay at least as long as the round trip takes, the load
        there and the way back (after ski rental: what keeps an instance from
        leaving a busy model for a tail one and coming back; a wake's short trip commits
        it for seconds, a cold load's for a minute or more). Never
        before arrivals have been watched for the absence (`ArrivalRates.watched_for`: no
        arrival yet says nothing of a rate, and a plane just started would give away its
        popular models' only instances for the first requests of tail ones).

        Kept, when other instances serve or load the target: its queued requests due after
        the load that the pool keeps with the instance and not without it (instances loading
        count, so two instances do not swap for the same requests); a wake from the standby
        tier at least the target's urgent arrivals expected while its backlog lasts
        (`backlog_risk`: a pool overrun by a burst drops what is due before the wake is
        ready, which the count leaves out, and goes on dropping the next arrivals). Kept,
        when it would be the target's only instance (`_gained_alone`): the target's queued
        requests due after the load that it keeps, and the target's arrivals over the stay;
        and a swap that breaks no promise (fewer than one) is always taken, so that a model
        no instance serves is served once the loaded one's traffic allows (not before:
        requests already late gain nothing, and wait while the loaded model keeps urgent
        traffic, as they did under the previous rule). A move to be the target's only
        instance is weighed with hysteresis (`_pays_alone`)."""
        fleet = self.fleet
        model = view.model_of(instance_id)
        profile = fleet.profile(target, fleet.instance(instance_id))
        if model is None or profile is None:
            return profile is not None
        standby = target in view.standby_models(instance_id)
        load_s = profile.load_time_s(standby)
        ready_s = now_s + load_s
        others = view.serving(target) + view.loading(target)
        back = fleet.profile(model, fleet.instance(instance_id))
        asleep = view.standby_capacity(instance_id) > 0  # it waits in the tier, or not
        back_s = 0.0 if back is None else back.load_time_s(asleep)
        stay_s = 0.0 if others else load_s + back_s  # ski rental: as long as the round trip
        away_s = load_s + stay_s + back_s
        lost = self._lost(view, (model, target), instance_id, now_s, away_s)
        if lost is None:
            return False  # too little seen of its arrivals to know what the absence costs
        if not others:
            spans_s = (load_s, stay_s, away_s)
            return lost < 1 or self._pays_alone(view, (model, target), instance_id, now_s, spans_s)
        gained: float = self._unkept(view, target, others, now_s, ready_s) - self._unkept(
            view, target, (*others, instance_id), now_s, ready_s
        )
        if standby and self.wake_for_backlog:
            gained = max(gained, self.backlog_risk(view, target, others, now_s, ready_s))
        return gained > lost

    def _pays_alone(
        self,
        view: FleetView,
        models: tuple[str, str],
        instance_id: str,
        now_s: float,
        spans_s: tuple[float, float, float],
    ) -> bool:
        """`swap_pays` for a move from its model to a target no other instance serves or
        loads, which breaks at least one promise. Such a move commits the instance for the
        round trip and is weighed with hysteresis: its own model's arrivals lost read at the
        higher of the recent and the longer-run rate, the target's gained at the lower
        (`Side`, qlm/agents/arrival_rates.py), and what is kept must outnumber what is broken
        by more than the counts' noise (`outweighs`); a model whose arrivals stopped loses
        nothing (`ArrivalRates.stopped`). A move beside other instances is free to come back
        and is weighed on the recent rate (hysteresis there held instances on models whose
        phase had ended: wb-quick's throughput fell to 0.6 of edf's at seeds 1 and 7).

        `models`: (its model, the target); `spans_s`: the target's load, the stay there and
        the whole absence from its model."""
        target = models[1]
        load_s, stay_s, away_s = spans_s
        lost = self._lost(view, models, instance_id, now_s, away_s, Side.HIGH)
        gained = self._gained_alone(view, target, instance_id, now_s, load_s, stay_s)
        return lost is not None and outweighs(gained, lost)

    def _lost(
        self,
        view: FleetView,
        models: tuple[str, str],
        instance_id: str,
        now_s: float,
        away_s: float,
        side: Side = Side.POINT,
    ) -> float | None:
        """`swap_pays`'s promises broken by a swap of the instance from its model to the
        target (`models`): its own model's for `away_s` away from it, and those of the
        sleeping models the swap sends cold from its tier (`cold_drop_loss`,
        qlm/agents/standby_rules.py); arrivals read as `side` says (None: arrivals not yet
        watched for that long)."""
        model, target = models
        pool = self.pool(view, model, instance_id)
        rest = tuple(i for i in pool if i != instance_id)
        lost: float = self._unkept(view, model, rest, now_s) - self._unkept(
            view, model, pool, now_s
        )
        lost += cold_drop_loss(self, view, instance_id, target, now_s, side)
        if rest:
            return lost
        if not self.arrivals.watched_for(now_s, away_s):
            return None
        return lost + self.arrivals.at_risk(model, now_s, away_s, side)

    def _gained_alone(
        self,
        view: FleetView,
        target: str,
        instance_id: str,
        now_s: float,
        load_s: float,
        stay_s: float,
    ) -> float:
        """`swap_pays`'s promises kept by the instance as the target's only one: the queued
        requests due after its load that it keeps, and the arrivals over its stay."""
        ready_s = now_s + load_s
        queued = self.queues.items(target).values()
        due_later = sum(item.ttft_deadline_at_s >= ready_s for item in queued)
        unkept = self._unkept(view, target, (instance_id,), now_s, ready_s)
        return due_later - unkept + self.arrivals.expected(target, now_s, stay_s, Side.LOW)

    def backlog_risk(
        self, view: FleetView, model: str, pool: tuple[str, ...], now_s: float, ready_s: float
    ) -> float:
        """The model's recent arrivals whose TTFT budget is shorter than the lag (how far
        the pool's last kept request's due start lies past `ready_s`), at their rate over
        the lag (`ArrivalRates.at_risk`): the arrivals that cannot wait for the pool's
        backlog, which an instance ready by `ready_s` would take a share of. A bound, not a
        prediction: an urgent arrival passes less urgent work in the queue. Wakes only: the
        recent rate holds seconds ahead, not a cold load's minutes (density.py `--grid`)."""
        starts = self.schedule(view, model, pool, now_s).start_at_s.values()
        lag_s = max(starts, default=now_s) - ready_s
        return self.arrivals.at_risk(model, now_s, lag_s)

    def _unkept(
        self,
        view: FleetView,
        model: str,
        pool: tuple[str, ...],
        now_s: float,
        due_from_s: float = -math.inf,
    ) -> int:
        """Queued requests of `model` the pool cannot keep (all of them for no pool), of
        those due at or after `due_from_s`."""
        if not pool:
            return self.queues.count(model)
        dropped = self.schedule(view, model, pool, now_s).dropped  # may list pulled ones
        queued = self.queues.queued(model)
        return sum(
            item.ttft_deadline_at_s >= due_from_s and queued(item.request_id) for item in dropped
        )

    # --- rule 2: the model's dispatch queue ----------------------------------------------------

    def pool(self, view: FleetView, model: str, instance_id: str) -> tuple[str, ...]:
        """The instances the model's schedule runs over: those serving it, and the asking
        instance while it loads the model (it will serve the queue it pulls from)."""
        pool = view.serving(model)
        if instance_id in pool or view.model_of(instance_id) != model:
            return pool
        order = {i.id: k for k, i in enumerate(self.fleet.instances)}
        return tuple(sorted((*pool, instance_id), key=order.__getitem__))

    def schedule(
        self, view: FleetView, model: str, pool: tuple[str, ...], now_s: float
    ) -> Schedule:
        """The model's schedule over `pool` (qlm/agents/model_queues.py), each class's due
        times shifted by the engine work blocking it (`blocked_s`)."""
        rate = self.rate(pool, model)
        return self.queues.schedule(model, pool, rate, now_s, lambda: self.blocked_s(view, pool))

    def rate(self, pool: tuple[str, ...], model: str) -> PoolRate:
        rate = self._rates.get((model, *pool))
        if rate is None:
            rate = self._rates[(model, *pool)] = PoolRate.of(self.fleet, pool, model)
        return rate

    def blocked_s(self, view: FleetView, pool: tuple[str, ...]) -> dict[str, float]:
        """Per SLO class, how long admitted work delays the pool's (as one machine) first
        token for a new request of that class (`start_blocks_by_rank`: a load, admitted
        prompts of its class or a more urgent one not prefilled yet, and the wait for room
        on an engine full of work it may not preempt). The pool's is the instances' work
        ahead over their speed together: the mean of theirs, weighted by their prefill
        speed (exact for the requests that start once every instance has done its own)."""
        work = dict.fromkeys(self.priority, 0.0)
        speed = 0.0
        for instance_id in pool:
            rate, blocks = view.blocks_of(instance_id)
            speed += rate
            for name, block_s in blocks.items():
                if name in work:
                    work[name] += block_s * rate
        return {name: w / speed if speed > 0 else 0.0 for name, w in work.items()}

    # --- the wait predictor: the schedule rule 2 serves -----------------------------------

    def predict(
        self, view: FleetView, item: QueuedItem, model: str, now_s: float
    ) -> Forecast | None:
        """A queued request's time to first token from its arrival, read off its model's
        schedule over the instances serving it: its start, moved back by the recent
        arrivals' work that will pass it (`passing`), the engine work that blocks its class
        (`blocked_s`), its prefill. A `Forecast` of None when the schedule drops it or the
        passing work moves its first token past its deadline;
        None (no forecast) when no instance serves the model or the schedule does not reach
        the request (past its class's window, `ModelQueues`)."""
        pool = view.serving(model)
        if not pool:
            return None
        schedule = self.schedule(view, model, pool, now_s)
        start_s = schedule.start_at_s.get(item.request_id)
        if start_s is None:
            dropped = any(d.request_id == item.request_id for d in schedule.dropped)
            return Forecast(None) if dropped else None
        deadline_s = item.ttft_deadline_at_s
        passed_s = start_with_passing(start_s, now_s, deadline_s, self.passing(model, pool, now_s))
        _, prefill_s = self.rate(pool, model).cost_s(item)
        blocked_s = self.queues.blocked_s(model, pool).get(item.slo_class, 0.0)
        first_s = passed_s + blocked_s + prefill_s
        if passed_s > max(start_s, now_s) and first_s > deadline_s:
            return Forecast(None)  # the work that passes it leaves it no room: dropped
        return Forecast(first_s - item.arrival_at_s)

    def passing(self, model: str, pool: tuple[str, ...], now_s: float) -> PassingRates:
        """The pool's work rates of the model's recent arrivals by TTFT budget
        (qlm/estimator/passing.py), priced again at most every `PASSING_REFRESH_S`."""
        key = (model, *pool)
        known = self._passing.get(key)
        if known is not None and now_s - known[0] < PASSING_REFRESH_S:
            return known[1]
        rate = self.rate(pool, model)
        recent = self.arrivals.recent(model, now_s)
        work = ((budget_s, rate.cost_s(item)[0]) for budget_s, item in recent)
        passing = PassingRates.of(work, self.arrivals.window_s)
        self._passing[key] = (now_s, passing)
        return passing
