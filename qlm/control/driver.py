"""When the controller runs: the one control path of the live loop and the simulator.

The `Controller` (controller.py) answers *what* to plan; this driver answers *when*, and owns
the scheduling state both adapters used to keep apart: which arrivals joined the plan, the
violation-check tick, the re-plan throttle, and the plan in flight. It has no I/O and reads no
clock: every call carries `now_s`. Adapters feed it events and carry out what it returns:

* `qlm/serve/loop.py` (live): every round offers the requests that are new in the queue, runs
  the check when `check_due`, and solves in a worker thread when `replan_due`;
* `qlm/sim/policies/qlm.py` (simulated): offers each arrival as it happens, runs the check on a
  timer every `tick_s`, and publishes a solved plan `planning_latency_s` of virtual time later.

The rules, stated once:

1. An arrival joins its nearest planned group (`Controller.on_arrival`). One that fits no
   planned group, or any arrival before the first plan, asks for a full re-plan.
2. While anything is queued, the estimator's violation check (`Controller.needs_replan`)
   runs every `tick_s`, the first one `tick_s` after the arrival (or request back from an
   engine) that found the queue empty; a group newly predicted late, a changed set of live
   instances or a grouping rebalance asks for a full re-plan. A check that finds the queue
   empty stops the ticking.
3. A re-plan asked for starts at once, or `min_replan_interval_s` after the previous start if
   that is later; asks in between coalesce into one.
4. While a plan is being solved or is in flight (not yet adopted), arrivals wait for it;
   they join the new plan when it is adopted, if still queued. Neither they nor the
   arrivals of rule 1 that asked for the re-plan are hidden meanwhile (`waiting`): the live
   loop shows them to agents, whose dispatch serves every queued request of their model by
   deadline, as the simulator's dispatch sees every queued request the moment it arrives.
   (An arrival of a model and class no planned group holds once waited, unseen, for the
   throttled re-plan of rule 3 and its solve: up to `min_replan_interval_s` on an idle
   fleet.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from qlm.config import ControlConfig
from qlm.control.controller import Controller, InstanceView
from qlm.control.plan import PublishedPlan
from qlm.types import Request


@dataclass(frozen=True, slots=True)
class Decision:
    """What one driver call changed.

    joined: (request id, group id) for each arrival that joined a planned group, in order.
    replan_at_s: set when this call asked for a re-plan that was not asked for already: the
    time it may start (adapters wake then; `replan_due` says the same).
    """

    joined: tuple[tuple[str, str], ...] = ()
    replan_at_s: float | None = None


NOTHING = Decision()


class ControlDriver:
    """The control path's state machine around one Controller (see the module docstring)."""

    def __init__(self, controller: Controller, config: ControlConfig) -> None:
        self.controller = controller
        self.config = config
        self._wanted_since_s: float | None = None  # a re-plan was asked for then
        self._last_replan_s = float("-inf")
        self._in_flight: PublishedPlan | None = None
        self._solving = False  # `begin_solve` was called; `solve` has not returned yet
        self._adopted: PublishedPlan | None = None
        self._deferred: list[Request] = []
        self._outside: dict[str, Request] = {}  # rule 1's arrivals that asked for a re-plan
        self._next_check_at_s: float | None = None  # None: nothing queued at the last look
        self.counts: dict[str, int] = {}

    @property
    def plan(self) -> PublishedPlan | None:
        """The adopted plan, with the arrivals that joined it: what agents reconcile against
        (the previous plan while a new one is in flight)."""
        return self._adopted

    @property
    def in_flight(self) -> bool:
        return self._in_flight is not None

    @property
    def waiting(self) -> tuple[Request, ...]:
        """The arrivals that wait for a plan (rule 4): those that fit no planned group and
        asked for a re-plan, then those that came while it was solved or in flight."""
        return (*self._outside.values(), *self._deferred)

    def _busy(self) -> bool:
        return self._solving or self._in_flight is not None

    # Arrivals

    def arrive(self, requests: Iterable[Request], now_s: float) -> Decision:
        """Offer new queued requests to the plan (rule 1; rule 4 while a plan is in flight)."""
        requests = list(requests)
        if requests:
            self.note_queued(now_s)
        if self._busy():
            self._deferred.extend(requests)
            return NOTHING
        joined: list[tuple[str, str]] = []
        asked: float | None = None
        for request in requests:
            plan = self.controller.on_arrival(request, now_s)
            if plan is None:
                self._count("arrivals_outside_plan")
                self._outside[request.id] = request
                first_ask = self._ask_replan(now_s)
                asked = asked if first_ask is None else first_ask
                continue
            self._count("arrivals_inserted")
            self._adopted = plan
            joined.append((request.id, self.controller.group_of(request.id) or ""))
        return Decision(tuple(joined), asked)

    def note_queued(self, now_s: float) -> None:
        """Something is queued (an arrival, or a request back from an engine): the violation
        check runs `tick_s` from now unless it is already ticking."""
        if self._next_check_at_s is None:
            self._next_check_at_s = now_s + self.config.tick_s

    def unplanned(self, queued: Iterable[Request]) -> list[Request]:
        """The queued requests the plan does not hold and that do not wait for a plan in
        flight: new arrivals, and requests back in the queue (evicted, or their agent died)
        that the plan forgot while they were out. The live loop offers these each round."""
        waiting = {r.id for r in self.waiting}
        return [r for r in queued if not self.controller.holds(r.id) and r.id not in waiting]

    # The violation check

    def wake_at_s(self) -> float | None:
        """The next time something is due without any new event (a check or a re-plan);
        None when nothing is."""
        times = [t for t in (self._next_check_at_s, self.replan_at_s()) if t is not None]
        return min(times, default=None)

    @property
    def check_useful(self) -> bool:
        """Whether a check could change anything: not while a re-plan is asked for or in
        flight (adapters skip gathering its inputs then)."""
        return not self._busy() and self._wanted_since_s is None

    def check_due(self, now_s: float) -> bool:
        return self._next_check_at_s is not None and now_s >= self._next_check_at_s

    def check(
        self, queued: Sequence[Request], views: Sequence[InstanceView], now_s: float
    ) -> Decision:
        """The periodic violation check (rule 2). Skipped while a re-plan is asked for or in
        flight, or when nothing is queued: its answer could not change what happens next."""
        if not queued:
            self._next_check_at_s = None
            return NOTHING
        self._next_check_at_s = now_s + self.config.tick_s
        if not self.check_useful:
            return NOTHING
        self.controller.forget_dequeued(queued)
        reason = self.controller.needs_replan(queued, views, now_s)
        self._count("violation_checks")
        if not reason.needed:
            return NOTHING
        self._count("replans_on_check")
        return Decision(replan_at_s=self._ask_replan(now_s))

    # Re-planning

    def replan_at_s(self) -> float | None:
        """When the re-plan asked for may start (rule 3); None when none is asked for."""
        if self._wanted_since_s is None or self._busy():
            return None
        return max(self._wanted_since_s, self._last_replan_s + self.config.min_replan_interval_s)

    def replan_due(self, now_s: float) -> bool:
        at_s = self.replan_at_s()
        return at_s is not None and now_s >= at_s

    def begin_solve(self) -> None:
        """The re-plan asked for starts now (the live loop calls this on its event loop
        before `solve` runs in a worker thread: from here arrivals wait for the new plan and
        no check or other re-plan starts, so nothing else touches the controller)."""
        self._wanted_since_s = None
        self._solving = True

    def solve(
        self, queued: Sequence[Request], views: Sequence[InstanceView], now_s: float
    ) -> PublishedPlan | None:
        """Regroup and solve over `queued` (`begin_solve` first, unless called at once: the
        simulator). The new plan is in flight until `adopt`. With nothing queued there is
        nothing to plan: the ask lapses and None comes back. If the solve raises, call
        `failed`: the last good plan stays adopted."""
        if not self._solving:
            self.begin_solve()
        try:
            if not queued:
                self._outside = {}  # nothing is queued: they left
                return None
            self._last_replan_s = now_s
            self._count("replans")
            plan = self.controller.replan(queued, views, now_s)
            self._in_flight = plan
            self._count(f"plans_{plan.status or 'unknown'}")
            return plan
        finally:
            self._solving = False

    def adopt(self, still_queued: Callable[[str], bool], now_s: float) -> Decision:
        """Adopt the plan in flight; arrivals that waited for it join it (rule 4)."""
        if self._in_flight is None:
            return NOTHING
        self._adopted, self._in_flight = self._in_flight, None
        self._outside = {}  # the plan was solved over them (those still queued)
        deferred, self._deferred = self._deferred, []
        # the live loop also defers queued requests the old plan lacked, which the new one
        # may hold already (it was solved over them)
        fresh = (r for r in deferred if still_queued(r.id) and not self.controller.holds(r.id))
        return self.arrive(fresh, now_s)

    def failed(self) -> None:
        """A solve raised: keep the last good plan; the next check may ask again."""
        self._in_flight = None
        self._solving = False
        self._deferred.clear()
        self._outside = {}  # offered again next round, they ask again

    def _ask_replan(self, now_s: float) -> float | None:
        if self._wanted_since_s is not None:
            return None
        self._wanted_since_s = now_s
        return self.replan_at_s()

    def _count(self, name: str) -> None:
        self.counts[name] = self.counts.get(name, 0) + 1
