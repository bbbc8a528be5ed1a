"""The dispatch decision's view of the global queue (`ModelQueues`): queued requests by model,
priced for each pool of instances they are scheduled over, each pool's schedule kept while it
stands (mutable, no I/O). The simulator keeps it exact (qlm/sim/policies/qlm_dispatch.py); a
live agent brings it in line with the plan's members each round (qlm/agents/live_queue.py),
the API with the queue it reads (qlm/api/wait_forecast.py), both with `sync`.

Jobs are kept sorted by due time per SLO class: engine work a request may not preempt
shifts all requests of its class by the same time, so the order the schedule needs (by due
time less that shift) is a merge of the classes' lists, and only its head is ever read."""

from __future__ import annotations

import bisect
import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from qlm.agents.dispatch import Job, PoolRate, Schedule, job_of, moore_hodgson, schedule_checked
from qlm.agents.reconcile import QueuedItem


class ModelQueues:
    """The global queue by model, priced for each pool it is asked about (a pool: a key
    naming the instances, with their `PoolRate`). A pool's schedule checks the first
    `max_jobs` requests by due time and lists the next `max_jobs` after them; it is made
    anew when a request joins that window, or leaves it while others wait past it."""

    def __init__(self, max_jobs: int = 1024, shed_every_s: float = 1.0) -> None:
        self.max_jobs = max_jobs
        self.shed_every_s = shed_every_s
        self._items: dict[str, dict[str, QueuedItem]] = {}
        self._model_of: dict[str, str] = {}
        self._pools: dict[tuple[str, tuple[str, ...]], _Priced] = {}  # (model, pool key)

    def add(self, item: QueuedItem, model: str) -> None:
        self.remove((item.request_id,))  # back from an engine: priced anew
        self._items.setdefault(model, {})[item.request_id] = item
        self._model_of[item.request_id] = model
        for (of_model, _), priced in self._pools.items():
            if of_model == model:
                priced.insert(job_of(item, priced.rate), self.max_jobs)

    def remove(self, request_ids: Iterable[str]) -> None:
        """Requests that left the queue."""
        for request_id in request_ids:
            model = self._model_of.pop(request_id, None)
            if model is None:
                continue
            del self._items[model][request_id]
            for (of_model, _), priced in self._pools.items():
                if of_model == model:
                    priced.discard(request_id, self.max_jobs)

    def sync(self, model: str, items: Mapping[str, QueuedItem]) -> None:
        """Bring the model's queue in line with `items` by difference: those gone removed,
        the new added in arrival order, as the simulator queues them (the queue's order of a
        class's requests breaks ties in what waits)."""
        kept = self.items(model)
        self.remove(sorted(kept.keys() - items.keys()))
        new = (items[rid] for rid in items.keys() - kept.keys())
        for item in sorted(new, key=lambda i: (i.arrival_at_s, i.request_id)):
            self.add(item, model)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._model_of

    def count(self, model: str) -> int:
        return len(self._items.get(model, ()))

    def items(self, model: str) -> Mapping[str, QueuedItem]:
        """The queued requests of `model` by id (a live view: do not change it)."""
        return self._items.get(model, {})

    def models(self) -> list[str]:
        """The models with queued requests."""
        return [model for model, items in self._items.items() if items]

    def queued(self, model: str) -> Callable[[str], bool]:
        return self._items.get(model, {}).__contains__

    def schedule(
        self,
        model: str,
        pool: tuple[str, ...],
        rate: PoolRate,
        now_s: float,
        blocked_s: Callable[[], Mapping[str, float]] = dict,
    ) -> Schedule:
        """The model's schedule over `pool` (priced by `rate`) from now. `blocked_s()`
        gives, per SLO class, how long work already in the engines that a request of the
        class may not preempt keeps the pool busy (a class missing: none): its requests
        are due that much earlier."""
        priced = self._pools.get((model, pool))
        if priced is None:
            priced = _Priced(rate)
            for item in self._items.get(model, {}).values():
                priced.insert(job_of(item, rate), self.max_jobs)
            self._pools[(model, pool)] = priced
        if priced.schedule is None:
            priced.blocked_s = dict(blocked_s())
            priced.set_aside_hopeless(now_s)
            waiting = len(priced.by_id) - len(priced.set_aside)
            if waiting > self.max_jobs and now_s >= priced.shed_at_s + self.shed_every_s:
                priced.shed(now_s)
            merged = priced.shifted()
            checked = list(itertools.islice(merged, self.max_jobs))
            rest = [job[3] for job in itertools.islice(merged, self.max_jobs)]
            set_aside = [
                job[3] for job in itertools.islice(priced.set_aside.values(), self.max_jobs)
            ]
            priced.listed_aside = {item.request_id for item in set_aside}
            priced.schedule = schedule_checked(checked, rest, now_s, set_aside)
        return priced.schedule

    def blocked_s(self, model: str, pool: tuple[str, ...]) -> Mapping[str, float]:
        """The blocking engine work the pool's last schedule was made with."""
        priced = self._pools.get((model, pool))
        return {} if priced is None else priced.blocked_s


@dataclass(slots=True)
class _Priced:
    """One pool's jobs for a model, sorted by due time per class, and its schedule while
    it stands."""

    rate: PoolRate
    by_class: dict[str, list[Job]] = field(default_factory=dict)
    by_id: dict[str, Job] = field(default_factory=dict)
    # Jobs that cannot start by their deadline less their prefill any more, and those a
    # `shed` dropped, served after the window's dropped: kept out of the window, so under
    # overload it holds requests that can still be saved.
    set_aside: dict[str, Job] = field(default_factory=dict)
    shed_at_s: float = -math.inf  # the last `shed`
    schedule: Schedule | None = None
    listed_aside: set[str] = field(default_factory=set)  # the set-aside the schedule lists
    blocked_s: dict[str, float] = field(default_factory=dict)

    def insert(self, job: Job, max_jobs: int) -> None:
        """A job joins; past the first `max_jobs` of its class it is past the window."""
        jobs = self.by_class.setdefault(job[3].slo_class, [])
        at = bisect.bisect_left(jobs, job)
        jobs.insert(at, job)
        self.by_id[job[3].request_id] = job
        if at < max_jobs:
            self.schedule = None

    def discard(self, request_id: str, max_jobs: int) -> None:
        """A job leaves. The schedule stands (the rest can still all be kept) unless the
        job was in the window while more jobs wait than it holds: one of those moves in; or
        the last set-aside job the schedule lists left while more are set aside (the
        schedule lists the first `max_jobs` of them: without a new one, those past them
        would wait for an arrival that may never come)."""
        job = self.by_id.pop(request_id, None)
        if job is None:
            return
        if self.set_aside.pop(request_id, None) is not None:
            self.listed_aside.discard(request_id)
            if not self.listed_aside and self.set_aside:
                self.schedule = None
            return
        jobs = self.by_class[job[3].slo_class]
        at = bisect.bisect_left(jobs, job)
        del jobs[at]
        if at < max_jobs <= len(self.by_id):
            self.schedule = None

    def set_aside_hopeless(self, now_s: float) -> None:
        """Move each class's leading jobs that can no longer start in time (due time less
        cost less the class's blocked work before now) to `set_aside`."""
        for slo_class, jobs in self.by_class.items():
            by_s = self.blocked_s.get(slo_class, 0.0)
            gone = 0
            while gone < len(jobs) and jobs[gone][0] - jobs[gone][2] - by_s < now_s:
                self.set_aside[jobs[gone][3].request_id] = jobs[gone]
                gone += 1
            del jobs[:gone]

    def shed(self, now_s: float) -> None:
        """Set aside the jobs Moore-Hodgson drops over the whole queue, not just the window:
        overload shows only over the deadline horizon, which a fast stream of requests
        fills with far more than the window holds."""
        self.shed_at_s = now_s
        _, dropped = moore_hodgson(self.shifted(), now_s)
        for item in dropped:
            job = self.by_id[item.request_id]
            jobs = self.by_class[item.slo_class]
            del jobs[bisect.bisect_left(jobs, job)]
            self.set_aside[item.request_id] = job

    def shifted(self) -> Iterator[Job]:
        """All jobs by due time less the blocked work of their class."""
        streams = [
            _shift(jobs, self.blocked_s.get(slo_class, 0.0))
            for slo_class, jobs in sorted(self.by_class.items())
        ]
        return heapq.merge(*streams)


def _shift(jobs: list[Job], by_s: float) -> Iterator[Job]:
    if by_s == 0.0:
        return iter(jobs)
    return ((due_s - by_s, rid, cost_s, item) for due_s, rid, cost_s, item in jobs)
