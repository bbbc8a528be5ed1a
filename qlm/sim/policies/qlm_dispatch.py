"""The `qlm` policy's dispatch on the virtual clock: what each instance's agent reconciles
(qlm/agents/dispatch.py), built from the simulator's view of the queue and the engines.

The global queue is kept by model (`ModelQueues`) with each model's schedule over the
instances now on it; an instance reconciles its virtual queue when it follows the plan to
another model, else its model's dispatch queue."""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping

from qlm.agents.actions import FetchStandby
from qlm.agents.decision import Dispatcher, engine_blocks
from qlm.agents.dispatch import (
    Schedule,
    dispatch_groups,
)
from qlm.agents.job_gate import prefilling_ids
from qlm.agents.pacing import Pacing, unheld
from qlm.agents.reconcile import QueuedGroup, QueuedItem
from qlm.agents.room import Room
from qlm.agents.standby_rules import idle_target
from qlm.agents.virtual_queue import head_model, virtual_queue
from qlm.agents.warming import fleet_fetches, hosts_of
from qlm.control.plan import PublishedPlan
from qlm.prefixes.affinity import PrefixAffinity
from qlm.prefixes.index import PrefixIndex
from qlm.sim.policies.policy_base import SimContext
from qlm.sim.result import TtftPrediction
from qlm.types import Request


class SimDispatch:
    def __init__(
        self,
        ctx: SimContext,
        priority: Mapping[str, int],
        members: int,
        wake_for_backlog: bool = True,
    ) -> None:
        self.ctx = ctx
        self.priority = priority
        self.members = members
        # The decision both planes run (qlm/agents/decision.py); this object is its FleetView.
        self.decision = Dispatcher(ctx.fleet, priority, wake_for_backlog=wake_for_backlog)
        self._queues = self.decision.queues
        # instance -> (prefill speed, class -> how long admitted work delays its next start)
        self._blocks: dict[str, tuple[float, dict[str, float]]] = {}
        self._room: dict[str, Room] = {}  # instance -> its room when last reconciled, untouched
        # Where prompt prefixes went (from pulls), once a request with a prefix has arrived:
        # dispatch then orders each instance's queue by prefix locality (`by_affinity`).
        self._prefixes: PrefixIndex | None = None
        # request -> (instance -> prefix tokens held), until the index next changes
        self._held: dict[str, dict[str, int]] = {}
        self._deferred: dict[str, dict[str, float]] = {}  # instance -> request -> held since
        # instance -> when the first request its dispatch held back (prefix hold, pacing) may
        # start (the policy wakes it then)
        self.hold_ends: dict[str, float] = {}
        self._pacing = Pacing.of(ctx.config)
        self._jobs = False  # a planned job's member with a leader has arrived (job_gate.py)
        self._hosts: dict[str, int] | None = None  # model -> instances that can serve it
        self._tiered: tuple[str, ...] | None = None  # instances with a standby tier
        self._loads_decided: dict[str, tuple[str, float]] = {}  # instance -> (model, when)

    def arrived(self, request: Request) -> None:
        """A new request (not one back from an engine): its model's recent arrivals."""
        self.decision.arrived(request.model, QueuedItem.of(request))

    def queue(self, request: Request) -> None:
        """A request joined the global queue (arrived, or back from an engine)."""
        self._queues.add(QueuedItem.of(request), request.model)
        self._jobs = self._jobs or request.job_leader is not None
        if request.prefix and self._prefixes is None:
            ctx = self.ctx
            self._prefixes = PrefixIndex(
                (i.id, ctx.observe(i.id).kv_capacity_tokens) for i in ctx.fleet.instances
            )

    def pulled(self, request_ids: Iterable[str], instance_id: str | None = None) -> None:
        """Requests left the queue (into `instance_id`'s engine, where given)."""
        if self._prefixes is not None and instance_id is not None:
            queued = self.ctx.queued()
            for request_id in request_ids:
                request = queued.get(request_id)
                if request is not None:
                    self._prefixes.record(instance_id, request.prefix)
            self._held.clear()
        self._queues.remove(request_ids)

    def load_decided(self, instance_id: str, model: str) -> None:
        """The instance's step decided to load `model` now: the steps of other instances at
        this instant count it as loading (a live agent sees another's load once that agent
        reports it; the simulator applies a round's actions after all its steps, and its
        idle instances all loaded the same model: tests/sim/test_swap_guard.py)."""
        self._loads_decided[instance_id] = (model, self.ctx.clock.now_s())

    def forget(self, instance_id: str) -> None:
        """The instance loads another model: its prefix cache is gone."""
        if self._prefixes is not None:
            self._prefixes.forget(instance_id)
            self._held.clear()

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._queues

    def with_room(self, model: str, arrival: Request | None = None) -> list[str]:
        """Instances on `model` with a free sequence slot that may pull; fewest requests held
        first (the least loaded, where a request starts soonest); ties: fleet order. An
        instance whose last reconcile did nothing and whose engine has not changed since
        (`saw`) is left out when its room stops at the request first in line for the model
        (`Room.stops`), or does not take the `arrival`, the one request new since then (the
        rest were there when it did nothing; time only tightens deadlines)."""
        ctx = self.ctx
        # With prefix locality each instance has its own first in line: no shortcut then.
        first = None if self._prefixes is not None else self._first_in_line(model)
        new = None if arrival is None or self._prefixes is not None else QueuedItem.of(arrival)
        free: list[tuple[int, int, str]] = []
        for k, instance_id in enumerate(ctx.serving(model)):
            room = self._room.get(instance_id)
            if room is not None and first is not None and room.stops(first):
                continue
            if room is not None and new is not None and not room.takes(new):
                continue
            held = ctx.held(instance_id)
            if held < ctx.max_num_seqs(instance_id):
                free.append((held, k, instance_id))
        return [instance_id for _, _, instance_id in sorted(free)]

    def _first_in_line(self, model: str) -> QueuedItem | None:
        """The request an instance serving the model's dispatch queue admits first."""
        pool = self.serving(model)
        if not pool:
            return None
        now_s = self.ctx.clock.now_s()
        kept = self._schedule(model, pool)
        anyone, _ = unheld(lambda _: True, kept.kept, kept.due_and_cost, self._pacing, now_s)
        line = dispatch_groups(model, kept, now_s, 1, anyone)
        return line[0].items[0] if line else None

    def heads(
        self, plan: PublishedPlan | None, instance_id: str, whole: bool
    ) -> tuple[QueuedGroup, ...]:
        """What the instance's agent reconciles: its virtual queue (the live agents' cut) when
        it follows the plan to another model, else the dispatch queue of the model it wakes
        from its standby tier or, with none, loads cold (`idle_target`) or of its model. Unless
        `whole`, the virtual queue is built only up to its first group of the loaded model
        (all `follows_swap` reads)."""
        ctx = self.ctx
        model = ctx.model_of(instance_id)
        until = None if whole else _until_model(model)
        queued = ctx.queued().__contains__
        stays = not whole and head_model(plan, instance_id, queued) == model
        planned = (
            ()
            if plan is None or stays  # the plan keeps it on its model: it serves the model
            else virtual_queue(plan, instance_id, queued, self.members, until)
        )
        now_s = ctx.clock.now_s()
        if self.decision.follows(self, instance_id, planned, now_s):
            return planned
        if model is None:
            return ()
        woken = idle_target(self.decision, self, instance_id, now_s)  # rules 1b, 1c
        pool: tuple[str, ...]
        if woken is not None:
            model, pool = woken, (instance_id,)
        else:
            pool = self.serving(model)
        kept = self._schedule(model, pool)
        limit = ctx.max_num_seqs(instance_id)
        still, paced_s = self._unheld(model, kept, now_s)
        affinity = self._affinity(instance_id, pool)
        prefilling = prefilling_ids(ctx.observe(instance_id)) if self._jobs else frozenset()
        groups = dispatch_groups(model, kept, now_s, limit, still, affinity, prefilling)
        wake_s = paced_s
        if affinity is not None:
            affinity.prune()
            wake_s = min(wake_s, affinity.wake_at_s)
        if wake_s < math.inf:
            self.hold_ends[instance_id] = wake_s
        return groups

    def _unheld(
        self, model: str, kept: Schedule, now_s: float
    ) -> tuple[Callable[[str], bool], float]:
        """The model's queued requests less those pacing holds back (qlm/agents/pacing.py),
        and when the first of those is due to start."""
        queued = self._queues.queued(model)
        return unheld(queued, kept.kept, kept.due_and_cost, self._pacing, now_s)

    def _affinity(
        self, instance_id: str, pool: tuple[str, ...]
    ) -> PrefixAffinity[QueuedItem] | None:
        """Prefix locality for `by_affinity` (None until a request with a prefix arrives):
        Preble's exploit rule over the `PrefixIndex`, with the rent-or-buy hold
        (qlm/prefixes/affinity.py); the earliest hold's end goes to `hold_ends`."""
        index = self._prefixes
        if index is None or len(pool) < 2:
            return None
        queued = self.ctx.queued()
        cache = self._held

        def held_of(item: QueuedItem) -> dict[str, int] | None:
            request = queued.get(item.request_id)
            if request is None or not request.prefix:
                return None
            held = cache.get(item.request_id)
            if held is None:
                held = cache[item.request_id] = index.best(pool, request.prefix)
            return held

        ctx = self.ctx
        model = ctx.model_of(instance_id)
        profile = (
            None if model is None else ctx.fleet.profile(model, ctx.fleet.instance(instance_id))
        )
        if profile is None:
            return None
        deferred = self._deferred.setdefault(instance_id, {})
        now_s = ctx.clock.now_s()
        return PrefixAffinity(instance_id, held_of, profile.prefill_s, deferred, now_s, pool)

    def predict(self, request: Request) -> TtftPrediction | None:
        """The decision's wait forecast for a request just queued (`Dispatcher.predict`,
        the one the API returns live): None when it makes none."""
        forecast = self.decision.predict(
            self, QueuedItem.of(request), request.model, self.ctx.clock.now_s()
        )
        if forecast is None:
            return None
        return TtftPrediction(forecast.first_token_s, request.prompt_tokens)

    def standby_fetches(self) -> tuple[FetchStandby, ...]:
        """What each instance with a standby tier fetches into it now (qlm/agents/warming.py):
        worths by instance shape (GPU type, count, memory: the same profiles fit)."""
        ctx = self.ctx
        fleet = ctx.fleet
        if self._tiered is None:  # a tier's size is the engine's setting: look once
            ids = [i.id for i in fleet.instances]
            self._tiered = tuple(i for i in ids if ctx.observe(i).standby_capacity > 0)
            self._hosts = hosts_of(fleet, {model for model, _ in fleet.profiles})
        if not self._tiered:
            return ()
        assert self._hosts is not None
        reports = (ctx.observe(i.id) for i in fleet.instances)
        return fleet_fetches(fleet, reports, self.decision.arrivals, ctx.clock.now_s(), self._hosts)

    def room_of(self, instance_id: str) -> Room | None:
        """The instance's room as its last reconcile, which did nothing, left it (None: it
        acted since, or its engine changed)."""
        return self._room.get(instance_id)

    def saw(self, instance_id: str, room: Room | None) -> None:
        """The instance's room after a reconcile that did nothing (None: it acted); kept
        until its engine next changes (`touched`)."""
        if room is None:
            self._room.pop(instance_id, None)
        else:
            self._room[instance_id] = room

    def touched(self, instance_id: str) -> None:
        """The instance's engine changed (events, or an action applied): observe it anew."""
        self._blocks.pop(instance_id, None)
        self._room.pop(instance_id, None)

    # --- the FleetView the decision reads (qlm/agents/decision.py): exact in the simulator ---

    def model_of(self, instance_id: str) -> str | None:
        return self.ctx.model_of(instance_id)

    def serving(self, model: str) -> tuple[str, ...]:
        """The instances serving `model` now (loaded, not loading)."""
        return self.ctx.serving(model)

    def loading(self, model: str) -> tuple[str, ...]:
        """The instances loading `model` now."""
        ctx = self.ctx
        now_s = ctx.clock.now_s()
        return tuple(
            i.id
            for i in ctx.fleet.instances
            if (ctx.loading(i.id) and ctx.model_of(i.id) == model)
            or self._loads_decided.get(i.id) == (model, now_s)
        )

    def standby_models(self, instance_id: str) -> Collection[str]:
        return self.ctx.observe(instance_id).standby_models

    def standby_capacity(self, instance_id: str) -> int:
        return self.ctx.observe(instance_id).standby_capacity

    def _schedule(self, model: str, pool: tuple[str, ...]) -> Schedule:
        return self.decision.schedule(self, model, pool, self.ctx.clock.now_s())

    def blocks_of(self, instance_id: str) -> tuple[float, dict[str, float]]:
        """The instance's prefill speed, and per class how long its admitted work delays a
        new request of that class (kept until the engine reports events or is acted on)."""
        known = self._blocks.get(instance_id)
        if known is None:
            ctx = self.ctx
            model = ctx.model_of(instance_id)
            assert model is not None
            profile = ctx.fleet.profile(model, ctx.fleet.instance(instance_id))
            assert profile is not None
            obs = ctx.observe(instance_id)
            known = self._blocks[instance_id] = engine_blocks(obs, profile, self.priority)
        return known


def _until_model(model: str | None) -> Callable[[QueuedGroup], bool]:
    """Stop building a virtual queue at its first group of `model`."""
    return lambda head: head.model == model
