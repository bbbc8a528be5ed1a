"""From a published plan to what an agent reconciles: written once for the live plane and the
simulator.

* `cut_for_agents`: the plan as agents are shown it: per instance, only the first
  `members` requests still queued (the head they admit from). The live loop publishes this cut;
  the simulator cuts the same way at every agent step (a loop that republishes at once).
* `virtual_queue`: one instance's planned groups as `QueuedGroup`s for the reconcile step, with
  each member's token counts and own SLO class, leaving out members the agent knows are gone
  (pulled by another instance, held by its own engine) and groups left empty.
* `head_model`: the model of an instance's first group with a queued member (what
  `follows_swap` reads), without building the queue.
* `planned_items`: every planned member of a model, each once, as dispatch prices them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace

from qlm.agents.reconcile import QueuedGroup, QueuedItem
from qlm.control.plan import PlannedGroup, PublishedPlan


def queued_members(
    plan: PublishedPlan, instance_id: str, is_queued: Callable[[str], bool], members: int | None
) -> Iterator[tuple[PlannedGroup, list[int]]]:
    """Each of the instance's planned groups with the positions of its members that are
    queued, at most `members` in all from the head (None: all); groups past that get none."""
    budget = members
    for group in plan.queue_of(instance_id):
        if budget is not None and budget <= 0:
            yield group, []
            continue
        keep = [i for i, rid in enumerate(group.request_ids) if is_queued(rid)]
        if budget is not None:
            keep = keep[:budget]
            budget -= len(keep)
        yield group, keep


def head_model(
    plan: PublishedPlan | None, instance_id: str, queued: Callable[[str], bool]
) -> str | None:
    """The model of the instance's first planned group with a member still queued (the
    head of its virtual queue: `follows_swap` keeps the instance on its model when it is
    that model's); None when there is none."""
    if plan is None:
        return None
    for group in plan.queue_of(instance_id):
        if any(queued(rid) for rid in group.request_ids):
            return group.model
    return None


def virtual_queue(
    plan: PublishedPlan,
    instance_id: str,
    is_queued: Callable[[str], bool],
    members: int | None = None,
    enough: Callable[[QueuedGroup], bool] | None = None,
) -> tuple[QueuedGroup, ...]:
    """The instance's virtual queue as its reconcile step sees it, in plan order. `enough`,
    when given, is asked after each group whether the queue built so far already decides
    what reconcile does (the simulator's shortcut); building stops when it says so."""
    heads: list[QueuedGroup] = []
    for group, keep in queued_members(plan, instance_id, is_queued, members):
        if not keep:
            continue
        prompts, outputs, classes = group.member_fields()
        deadlines = group.deadlines_at_s()
        items = tuple(
            QueuedItem(group.request_ids[i], prompts[i], outputs[i], classes[i], deadlines[i])
            for i in keep
        )
        head = QueuedGroup(group.group_id, group.model, group.slo_class, items)
        heads.append(head)
        if enough is not None and enough(head):
            break
    return tuple(heads)


def cut_for_agents(plan: PublishedPlan, queued_ids: set[str], members: int) -> PublishedPlan:
    """The plan as agents are shown it: each virtual queue listing only its first `members`
    requests still queued; groups past the head stay, empty, with the predicted wait of their
    last member (`group_wait_s`, for the API's SLO gate). Keeps each publish, and each agent's
    read of it, small however long the queue."""
    groups: dict[str, PlannedGroup] = {}
    forecast = plan.forecast
    group_wait_s: dict[str, float] = {}
    for instance_id in plan.queues:
        for group, keep in queued_members(plan, instance_id, queued_ids.__contains__, members):
            whole = len(keep) == len(group.request_ids)
            groups[group.group_id] = group if whole else subset(group, keep)
            member_waits = [forecast.predicted_wait_s.get(rid) for rid in group.request_ids]
            if known := [w for w in member_waits if w is not None]:
                group_wait_s[group.group_id] = max(known)
    waits = {
        rid: forecast.predicted_wait_s[rid]
        for group in groups.values()
        for rid in group.request_ids
        if rid in forecast.predicted_wait_s
    }
    done = {g: forecast.group_done_s[g] for g in groups if g in forecast.group_done_s}
    steps = {g: forecast.group_step_s[g] for g in groups if g in forecast.group_step_s}
    cut = replace(
        forecast,
        predicted_wait_s=waits,
        group_wait_s=group_wait_s,
        group_done_s=done,
        group_step_s=steps,
    )
    return replace(plan, groups=groups, forecast=cut)


def shown(view: PublishedPlan) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """What agents see of a plan: per instance, the requests in queue order."""
    return tuple(
        (instance_id, tuple(rid for g in view.queue_of(instance_id) for rid in g.request_ids))
        for instance_id in sorted(view.queues)
    )


def subset(group: PlannedGroup, positions: Sequence[int]) -> PlannedGroup:
    """The group with only the members at `positions` (in order), per-member fields kept."""
    return replace(
        group,
        request_ids=tuple(group.request_ids[i] for i in positions),
        prompt_tokens=tuple(group.prompt_tokens[i] for i in positions if group.prompt_tokens),
        max_output_tokens=tuple(
            group.max_output_tokens[i] for i in positions if group.max_output_tokens
        ),
        slo_classes=tuple(group.slo_classes[i] for i in positions if group.slo_classes),
        ttft_deadlines_at_s=tuple(
            group.ttft_deadlines_at_s[i] for i in positions if group.ttft_deadlines_at_s
        ),
        arrivals_at_s=tuple(group.arrivals_at_s[i] for i in positions if group.arrivals_at_s),
        job_orders=tuple(group.job_orders[i] for i in positions if group.job_orders),
        job_leaders=tuple(group.job_leaders[i] for i in positions if group.job_leaders),
    )


def planned_items(
    plan: PublishedPlan, model: str, known: dict[str, QueuedItem]
) -> dict[str, QueuedItem]:
    """The planned members of `model` by request id, all of them (queued or not); those in
    `known` reused as they are."""
    items: dict[str, QueuedItem] = {}
    for group in plan.groups.values():
        if group.model != model:
            continue
        fresh = [i for i, rid in enumerate(group.request_ids) if rid not in known]
        for rid in group.request_ids:
            if rid in known:
                items[rid] = known[rid]
        if not fresh:
            continue
        prompts, outputs, classes = group.member_fields()
        deadlines, arrivals = group.deadlines_at_s(), group.arrivals()
        for i in fresh:
            fields = (prompts[i], outputs[i], classes[i], deadlines[i], arrivals[i])
            rid = group.request_ids[i]
            items[rid] = QueuedItem(rid, *fields, *group.job_order_of(i))
    return items
