"""The control loop's pure step: queued requests + instance views -> a published plan.

The control driver (driver.py), which both the live control loop (qlm/serve/loop.py) and the
simulator's `qlm` policy run, drives this object, so they run the same grouping, estimator and
planner. It owns no I/O and reads time only through the now_s it is given.

When to re-plan follows the paper: a full re-plan (regroup + solve) when there is no plan yet,
when queued requests are not covered by the plan and could not be inserted into a planned
group, when grouping asks for a rebalance, or when the estimator's violation check finds a
group predicted to miss its deadline that the last plan did not already expect to miss, or
when the instances that are up (those with a view) differ from the last re-plan's.
New arrivals otherwise join their nearest planned group (`on_arrival`) without solving.
*When* each of these runs is the driver's business.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from qlm.clock import Clock
from qlm.config import QlmConfig
from qlm.control.plan import (
    JobBudgets,
    LoneSpeed,
    PlanForecast,
    PlannedGroup,
    PublishedPlan,
    planned_group,
)
from qlm.estimator import make_estimator
from qlm.grouping import make_grouping
from qlm.grouping.group import RequestGroup
from qlm.perf.profile import Profile
from qlm.prefixes.job_plan import job_budget
from qlm.solver import Plan, PlanInput, make_planner
from qlm.types import Fleet, Request


@dataclass(frozen=True, slots=True)
class InstanceView:
    """An instance as the controller sees it: its model (the one loading, while loading) and
    how long the work already in its engine will take to drain."""

    instance_id: str
    loaded_model: str | None
    busy_s: float = 0.0
    standby_models: tuple[str, ...] = ()  # asleep there, fast to wake (qlm/engine/model/tiers.py)
    standby_capacity: int = 0  # models its tier holds at most


@dataclass(frozen=True, slots=True)
class ReplanReason:
    needed: bool
    why: str


class Controller:
    def __init__(
        self,
        config: QlmConfig,
        fleet: Fleet,
        clock: Clock,
        planner_policy: str | None = None,
    ) -> None:
        planner_config = config.planner
        if planner_policy is not None:
            planner_config = planner_config.model_copy(update={"policy": planner_policy})
        self.config = config
        self.fleet = fleet
        self._slo = config.slo_class_map()
        self._grouping = make_grouping(config.grouping)
        self._estimator = make_estimator(config.estimator, fleet)
        self._planner = make_planner(planner_config, self._estimator, clock)
        self._published: PublishedPlan | None = None
        self._solved: Plan | None = None
        self._late_at_plan: frozenset[str] = frozenset()
        self._up_at_plan: frozenset[str] = frozenset()  # instances the last re-plan could use
        self._member_of: dict[str, str] = {}
        self._replanned: frozenset[str] = frozenset()  # the requests the last re-plan grouped
        self._placed: frozenset[str] = frozenset()
        self._epoch = 0

    @property
    def plan(self) -> PublishedPlan | None:
        """The latest published plan."""
        return self._published

    @property
    def last_solve(self) -> Plan | None:
        """The planner's result behind the latest full re-plan."""
        return self._solved

    def replan(
        self, queued: Sequence[Request], instances: Sequence[InstanceView], now_s: float
    ) -> PublishedPlan:
        """Regroup every queued request and solve from scratch."""
        fleet = self._fleet_now(instances)
        busy = {v.instance_id: v.busy_s for v in instances}
        groups = self._grouping.regroup(queued, now_s)
        requests = {r.id: r for r in queued}
        # arrived since the last full re-plan (joined a planned group since, or not)
        new = sum(1 for r in queued if r.id not in self._replanned)
        solved = self._planner.plan(
            PlanInput(groups, fleet, now_s, busy_s=busy, slo_classes=self._slo, new_requests=new)
        )
        waits, done, steps = self._predictions(solved, groups, fleet, busy)
        self._solved = solved
        self._late_at_plan = frozenset(solved.late_groups)
        self._up_at_plan = frozenset(v.instance_id for v in instances)
        self._member_of = {rid: g.id for g in groups for rid in g.request_ids}
        self._replanned = frozenset(self._member_of)
        self._placed = frozenset(g for q in solved.queues.values() for g in q)
        return self._publish(
            PublishedPlan(
                epoch=0,
                created_at_s=now_s,
                queues=solved.queues,
                groups={g.id: _planned(g, requests) for g in groups},
                policy=solved.policy,
                status=str(solved.status),
                forecast=PlanForecast(
                    predicted_wait_s=waits,
                    waits_at_s=now_s,
                    group_done_s=done,
                    lone=lone_speeds(fleet),
                    group_step_s=steps,
                ),
                jobs=JobBudgets(_job_budgets(fleet, self.config.grouping.max_group_size)),
            )
        )

    def on_arrival(self, request: Request, now_s: float) -> PublishedPlan | None:
        """Insert a new request into its nearest planned group. Returns the updated plan, or
        None when the request fits no planned group (a re-plan is needed)."""
        plan = self._published
        if plan is None:
            return None
        group_id = self._planned_home(self._grouping.add(request), plan)
        if group_id is None:
            # Leave no trace: the caller may offer the request again before the re-plan
            # (re-plans are rate-limited in the live loop).
            self._grouping.remove(request.id)
            return None
        group = plan.groups[group_id]
        self._member_of[request.id] = group_id
        grown = group.with_request(
            request.id,
            request.prompt_tokens,
            request.max_output_tokens,
            request.slo_class,
            request.ttft_deadline_at_s,
            request.arrival_at_s,
            (request.job_order, request.job_leader),
        )
        return self._publish(
            replace(plan, created_at_s=now_s, groups={**plan.groups, group_id: grown})
        )

    def _planned_home(self, group_id: str, plan: PublishedPlan) -> str | None:
        """The placed group a new member joins: its own group if placed, else the last placed
        part of the same cluster (grouping splits a key's requests in deadline order into
        `{key}.{part}`, and a new arrival has the latest deadline)."""
        if group_id in self._placed:
            return group_id
        key = group_id.rpartition(".")[0]
        siblings = [g for g in self._placed if g.rpartition(".")[0] == key]
        return max(siblings, key=_part_index) if siblings else None

    def holds(self, request_id: str) -> bool:
        """Whether the plan has the request in one of its groups."""
        return request_id in self._member_of

    def group_of(self, request_id: str) -> str | None:
        return self._member_of.get(request_id)

    def forget_dequeued(self, queued: Sequence[Request]) -> None:
        """Drop requests that left the queue (pulled, cancelled) from grouping, so groups
        shrink as they are served and do not split on every arrival."""
        queued_ids = {r.id for r in queued}
        for request_id in [rid for rid in self._member_of if rid not in queued_ids]:
            del self._member_of[request_id]
            with contextlib.suppress(KeyError):
                self._grouping.remove(request_id)

    def needs_replan(
        self, queued: Sequence[Request], instances: Sequence[InstanceView], now_s: float
    ) -> ReplanReason:
        """The estimator's violation check over the current plan, as in the paper. Call
        `forget_dequeued` first when requests may have left the queue since the last plan."""
        if self._published is None:
            return ReplanReason(bool(queued), "no plan yet")
        uncovered = sum(r.id not in self._member_of for r in queued)
        if uncovered:
            return ReplanReason(True, f"{uncovered} queued requests outside the plan")
        if self._grouping.needs_regroup:
            return ReplanReason(True, "grouping rebalance due")
        up = frozenset(v.instance_id for v in instances)
        if queued and up != self._up_at_plan:  # one went down, or one is back (or new)
            return ReplanReason(True, f"instances up changed: {sorted(up ^ self._up_at_plan)}")
        late = self._newly_late(queued, instances, now_s)
        if late:
            return ReplanReason(True, f"groups newly predicted late: {sorted(late)[:5]}")
        return ReplanReason(False, "plan holds")

    def _newly_late(
        self, queued: Sequence[Request], instances: Sequence[InstanceView], now_s: float
    ) -> set[str]:
        plan = self._published
        assert plan is not None
        by_group: dict[str, list[Request]] = {}
        for r in queued:
            by_group.setdefault(self._member_of[r.id], []).append(r)
        fleet = self._fleet_now(instances)
        busy = {v.instance_id: v.busy_s for v in instances}
        late: set[str] = set()
        for instance_id, group_ids in plan.queues.items():
            queue = [
                RequestGroup.of(g, by_group[g]) for g in group_ids if g in by_group
            ]  # members still queued
            if not queue:
                continue
            if instance_id not in busy:  # the instance is down: its groups would never start
                late.update(g.id for g in queue)
                continue
            instance = fleet.instance(instance_id)
            estimate = self._estimator.estimate_queue(queue, instance, busy.get(instance_id, 0.0))
            for v in self._estimator.violations(queue, estimate, now_s):
                if v.group_id not in self._late_at_plan:
                    late.add(v.group_id)
        return late

    def _publish(self, plan: PublishedPlan) -> PublishedPlan:
        self._epoch += 1
        self._published = plan.with_epoch(self._epoch)
        return self._published

    def _fleet_now(self, instances: Sequence[InstanceView]) -> Fleet:
        """The instances that are up (those with a view), each with the model it holds."""
        views = {v.instance_id: v for v in instances}
        return Fleet(
            tuple(
                replace(
                    i,
                    loaded_model=views[i.id].loaded_model,
                    standby_models=views[i.id].standby_models,
                    standby_capacity=views[i.id].standby_capacity,
                )
                for i in self.fleet.instances
                if i.id in views
            ),
            self.fleet.profiles,
        )

    def _predictions(
        self,
        plan: Plan,
        groups: Sequence[RequestGroup],
        fleet: Fleet,
        busy: Mapping[str, float],
    ) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
        """Each planned request's predicted mean time to first token; each planned group's
        predicted mean completion of its last member, from now, and its decode step."""
        by_id = {g.id: g for g in groups}
        waits: dict[str, float] = {}
        done: dict[str, float] = {}
        steps: dict[str, float] = {}
        for instance_id, group_ids in plan.queues.items():
            if not group_ids:
                continue
            queue = [by_id[g] for g in group_ids]
            est = self._estimator.estimate_queue(
                queue, fleet.instance(instance_id), busy.get(instance_id, 0.0)
            )
            waits.update(zip(est.request_ids, (float(t) for t in est.ttft_mean_s), strict=True))
            done.update((g.group_id, g.completion_mean_s) for g in est.groups)
            steps.update((g.group_id, g.decode_step_s) for g in est.groups)
        return waits, done, steps


def _part_index(group_id: str) -> int:
    tail = group_id.rpartition(".")[2]
    return int(tail) if tail.isdigit() else -1


def _planned(group: RequestGroup, by_id: Mapping[str, Request]) -> PlannedGroup:
    members = [by_id[rid] for rid in group.request_ids]
    return planned_group(group.id, group.model, members, group.slo_class)


def _job_budgets(fleet: Fleet, group_requests: int) -> dict[str, tuple[int, int, int]]:
    """Per model of the fleet, what one batch job part may hold and one planning group of a
    job (qlm/prefixes/job_plan.py)."""
    budgets = {}
    for model in fleet.models:
        budget = job_budget(fleet, model, group_requests)
        budgets[model] = (budget.kv_tokens, budget.max_requests, budget.group_requests)
    return budgets


def lone_speeds(fleet: Fleet) -> dict[str, LoneSpeed]:
    """Per model, how fast a lone request runs on the fleet's best instance for it
    (`fleet`: the live instances, each with the model it holds): one holding the model if
    any, else one that must load it first (its `load_s` counted); among those, the shortest
    decode step at batch size 1. Instances the model does not fit are left out."""
    best: dict[str, tuple[bool, float, Profile]] = {}
    for instance in fleet.instances:
        for model in fleet.models:
            profile = fleet.profile(model, instance)
            if profile is None or not fleet.can_serve(instance, model):
                continue
            key = (instance.loaded_model != model, profile.decode_step_s_at(1), profile)
            if model not in best or key[:2] < best[model][:2]:
                best[model] = key
    return {m: _lone(p, must_load) for m, (must_load, _, p) in best.items()}


def _lone(profile: Profile, must_load: bool) -> LoneSpeed:
    return LoneSpeed(
        profile.prefill_tokens_per_s,
        profile.decode_step_s_at(1),
        profile.output_tokens_mean,
        profile.load_s if must_load else 0.0,
    )
