"""The controller's output: a published plan (virtual queues of planned groups per instance,
with each request's predicted wait), as agents read it and the queue stores it."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from types import MappingProxyType
from typing import Any

from qlm.types import Request


@dataclass(frozen=True, slots=True)
class PlannedGroup:
    """A group in a published plan. prompt_tokens and max_output_tokens run parallel to
    request_ids, so an agent can budget KV without fetching each request."""

    group_id: str
    model: str
    slo_class: str
    request_ids: tuple[str, ...]
    prompt_tokens: tuple[int, ...] = ()
    max_output_tokens: tuple[int, ...] = ()
    slo_classes: tuple[str, ...] = ()  # each member's own class (a group may mix classes)
    ttft_deadlines_at_s: tuple[float, ...] = ()  # each member's TTFT deadline
    arrivals_at_s: tuple[float, ...] = ()  # each member's arrival (pacing reads it)
    # each member's key in its batch job's planned order ("" outside a planned job)
    job_orders: tuple[str, ...] = ()
    # each member's job part leader, or its program fork's ("" for none; qlm/prefixes/
    # job_plan.py, qlm/programs/fork.py)
    job_leaders: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        n = len(self.request_ids)
        members = ("prompt_tokens", "max_output_tokens", "slo_classes", "ttft_deadlines_at_s")
        for name in (*members, "arrivals_at_s", "job_orders", "job_leaders"):
            if len(getattr(self, name)) not in (0, n):
                raise ValueError(f"group {self.group_id}: {name} must match request_ids")

    def to_dict(self) -> dict[str, Any]:
        """Plain fields (dataclasses.asdict deep-copies every tuple element: too slow for a
        plan published many times a second)."""
        return {
            "group_id": self.group_id,
            "model": self.model,
            "slo_class": self.slo_class,
            "request_ids": list(self.request_ids),
            "prompt_tokens": list(self.prompt_tokens),
            "max_output_tokens": list(self.max_output_tokens),
            "slo_classes": list(self.slo_classes),
            "ttft_deadlines_at_s": list(self.ttft_deadlines_at_s),
            "arrivals_at_s": list(self.arrivals_at_s),
            "job_orders": list(self.job_orders),
            "job_leaders": list(self.job_leaders),
        }

    def member_fields(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[str, ...]]:
        """Prompt tokens, output caps and SLO classes, one per member. A group published
        without them (an older writer) reads as 1-token requests of the group's class."""
        n = len(self.request_ids)
        return (
            self.prompt_tokens or (1,) * n,
            self.max_output_tokens or (1,) * n,
            self.slo_classes or (self.slo_class,) * n,
        )

    def deadlines_at_s(self) -> tuple[float, ...]:
        """Each member's TTFT deadline; a group published without them reads as no deadline
        (dispatch then orders those members last within their class)."""
        return self.ttft_deadlines_at_s or (math.inf,) * len(self.request_ids)

    def arrivals(self) -> tuple[float, ...]:
        """Each member's arrival; -inf for a group published without them (unknown)."""
        return self.arrivals_at_s or (-math.inf,) * len(self.request_ids)

    def job_order_of(self, position: int) -> tuple[str | None, str | None]:
        """The member's key in its job's planned order and its part's (or its fork's,
        qlm/programs/fork.py) leader; None for what it has not."""
        order = self.job_orders[position] if self.job_orders else ""
        leader = self.job_leaders[position] if self.job_leaders else ""
        return order or None, leader or None

    def with_request(
        self,
        request_id: str,
        prompt_tokens: int,
        max_output_tokens: int,
        slo_class: str,
        ttft_deadline_at_s: float = math.inf,
        arrival_at_s: float = -math.inf,
        job_order: tuple[str | None, str | None] = (None, None),
    ) -> PlannedGroup:
        prompts, outputs, classes = self.member_fields()
        return replace(
            self,
            request_ids=(*self.request_ids, request_id),
            prompt_tokens=(*prompts, prompt_tokens),
            max_output_tokens=(*outputs, max_output_tokens),
            slo_classes=(*classes, slo_class),
            ttft_deadlines_at_s=(*self.deadlines_at_s(), ttft_deadline_at_s),
            arrivals_at_s=(*self.arrivals(), arrival_at_s),
            job_orders=_grown(self.job_orders, len(self.request_ids), job_order[0]),
            job_leaders=_grown(self.job_leaders, len(self.request_ids), job_order[1]),
        )


def planned_group(
    group_id: str, model: str, members: Sequence[Request], slo_class: str = ""
) -> PlannedGroup:
    """A group of these requests, in order, with each member's fields (job orders only when
    a member is in a planned batch job, leaders only when one has a leader: a job part's, or
    a program fork's)."""
    jobs = any(r.job_order is not None for r in members)
    led = any(r.job_leader is not None for r in members)
    return PlannedGroup(
        group_id,
        model,
        slo_class,
        tuple(r.id for r in members),
        tuple(r.prompt_tokens for r in members),
        tuple(r.max_output_tokens for r in members),
        tuple(r.slo_class for r in members),
        tuple(r.ttft_deadline_at_s for r in members),
        tuple(r.arrival_at_s for r in members),
        tuple(r.job_order or "" for r in members) if jobs else (),
        tuple(r.job_leader or "" for r in members) if led else (),
    )


def _grown(values: tuple[str, ...], count: int, value: str | None) -> tuple[str, ...]:
    """A per-member string field with one member more ("" for none; () while all are)."""
    if not values and value is None:
        return ()
    return (*(values or ("",) * count), value or "")


def _read_only(mapping: Mapping[str, Any]) -> Mapping[str, Any]:
    return mapping if isinstance(mapping, MappingProxyType) else MappingProxyType(dict(mapping))


@dataclass(frozen=True, slots=True)
class LoneSpeed:
    """How fast one request of a model runs on an idle instance (the fastest of the fleet's
    live instances for it, by its profile): what the API prices a request with when nothing
    of its kind is planned."""

    prefill_tokens_per_s: float
    decode_step_s: float  # one decode iteration at batch size 1
    output_tokens_mean: float
    load_s: float = 0.0  # the model must be loaded first: no live instance holds it

    def first_token_s(self, prompt_tokens: int) -> float:
        return self.load_s + prompt_tokens / self.prefill_tokens_per_s

    def completion_s(self, prompt_tokens: int, output_tokens: float) -> float:
        return self.first_token_s(prompt_tokens) + output_tokens * self.decode_step_s


def _freeze(section: Any, names: Sequence[str]) -> None:
    """Wrap a frozen section's mappings read-only (once: a section derived from another shares
    the mappings it did not change, so copying them again would make each arrival cost the
    size of the whole plan)."""
    for name in names:
        object.__setattr__(section, name, _read_only(getattr(section, name)))


@dataclass(frozen=True)
class PlanForecast:
    """What the plan predicts. Written by the controller at each re-plan and each arrival it
    places (qlm/control/controller.py); `group_wait_s` by the cut for agents
    (qlm/agents/virtual_queue.py). Read by the API's wait estimate (qlm/api/wait_estimate.py),
    the Batch API's runner, program deadlines, the request records and the metrics."""

    predicted_wait_s: Mapping[str, float] = field(default_factory=dict)  # by request id
    # When the predicted waits were computed (the last full re-plan): plans derived since
    # (arrivals inserted) move created_at_s but not the waits. None: created_at_s.
    waits_at_s: float | None = None
    # Per group, the predicted wait of its last member. Set on plans cut for agents (only
    # the head of each queue is listed), so that readers still see how long each group is.
    group_wait_s: Mapping[str, float] = field(default_factory=dict)
    # Per group, the predicted mean completion of its last member (from waits_at_s, like the
    # waits): when a newcomer that joins the group would finish.
    group_done_s: Mapping[str, float] = field(default_factory=dict)
    lone: Mapping[str, LoneSpeed] = field(default_factory=dict)  # by model
    # Per group, one decode iteration of its batch on its instance: a newcomer's own output
    # takes its tokens times this after its first token.
    group_step_s: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        names = ("predicted_wait_s", "group_wait_s", "group_done_s", "lone", "group_step_s")
        _freeze(self, names)


@dataclass(frozen=True)
class JobBudgets:
    """What one part of a batch job may hold, per model: (KV tokens, requests) on the smallest
    instance on the model, and the requests of one planning group (the grouping's largest).
    Written by the controller from the fleet; read by the Batch API's runner when it plans a
    job (qlm/prefixes/job_plan.py's PlanBudget)."""

    by_model: Mapping[str, tuple[int, int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _freeze(self, ("by_model",))


@dataclass(frozen=True)
class AgentNotes:
    """What the live control loop adds when it cuts the plan for agents (qlm/serve/loop.py),
    from the whole queue and the agents' reports; read by the agents. The simulator's agents
    read the same facts from its exact state instead (qlm/agents/README.md)."""

    # Per request with a prompt prefix some instance probably caches: the prompt tokens each
    # such instance holds (qlm/prefixes/reports.py writes it, qlm/prefixes/affinity.py reads it).
    prefix_held: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # Per model and SLO class, the requests queued when the plan was cut for agents: those
    # past the published head too (pacing counts the work agents do not see).
    queued_counts: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    # Per instance with a standby tier, the model it should read into the tier now and the
    # one whose place it takes (None: a free place); qlm/agents/warming.py decides.
    standby_fetches: Mapping[str, tuple[str, str | None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _freeze(self, ("prefix_held", "queued_counts", "standby_fetches"))


@dataclass(frozen=True)
class PublishedPlan:
    """Virtual queues as the control loop publishes them: the plan itself (`queues`,
    `groups`, the planner's `policy` and `status`), then one typed section per writer:
    `forecast` (the controller's predictions), `jobs` (the controller's batch-job budgets)
    and `notes` (the live loop's additions for agents). `epoch` grows with every publish;
    agents ignore plans older than the one they hold. On the wire (`to_json`) the sections'
    fields sit flat beside the plan's, as before they were sections."""

    epoch: int
    created_at_s: float
    queues: Mapping[str, tuple[str, ...]]  # instance id -> group ids, in order
    groups: Mapping[str, PlannedGroup]
    policy: str = ""
    status: str = ""
    forecast: PlanForecast = field(default_factory=PlanForecast)
    jobs: JobBudgets = field(default_factory=JobBudgets)
    notes: AgentNotes = field(default_factory=AgentNotes)

    def __post_init__(self) -> None:
        _freeze(self, ("queues", "groups"))

    def with_epoch(self, epoch: int) -> PublishedPlan:
        return replace(self, epoch=epoch)

    def queue_of(self, instance_id: str) -> tuple[PlannedGroup, ...]:
        return tuple(self.groups[g] for g in self.queues.get(instance_id, ()) if g in self.groups)

    def group_of(self, request_id: str) -> str | None:
        for group in self.groups.values():
            if request_id in group.request_ids:
                return group.group_id
        return None

    def to_json(self) -> str:
        forecast, notes = self.forecast, self.notes
        return json.dumps(
            {
                "epoch": self.epoch,
                "created_at_s": self.created_at_s,
                "queues": {k: list(v) for k, v in self.queues.items()},
                "groups": {k: g.to_dict() for k, g in self.groups.items()},
                "policy": self.policy,
                "status": self.status,
                "predicted_wait_s": dict(forecast.predicted_wait_s),
                "waits_at_s": forecast.waits_at_s,
                "group_wait_s": dict(forecast.group_wait_s),
                "group_done_s": dict(forecast.group_done_s),
                "lone": {m: asdict(s) for m, s in forecast.lone.items()},
                "group_step_s": dict(forecast.group_step_s),
                "prefix_held": {r: dict(h) for r, h in notes.prefix_held.items()},
                "queued_counts": {m: dict(c) for m, c in notes.queued_counts.items()},
                "job_budgets": {m: list(b) for m, b in self.jobs.by_model.items()},
                "standby_fetches": {i: list(f) for i, f in notes.standby_fetches.items()},
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> PublishedPlan:
        data = json.loads(text)
        return cls(
            epoch=data["epoch"],
            created_at_s=data["created_at_s"],
            queues={k: tuple(v) for k, v in data["queues"].items()},
            groups={k: _group_from_dict(g) for k, g in data["groups"].items()},
            policy=data.get("policy", ""),
            status=data.get("status", ""),
            forecast=PlanForecast(
                predicted_wait_s=data.get("predicted_wait_s", {}),
                waits_at_s=data.get("waits_at_s"),
                group_wait_s=data.get("group_wait_s", {}),
                group_done_s=data.get("group_done_s", {}),
                lone={m: LoneSpeed(**s) for m, s in data.get("lone", {}).items()},
                group_step_s=data.get("group_step_s", {}),
            ),
            jobs=JobBudgets(
                {m: (b[0], b[1], b[2]) for m, b in data.get("job_budgets", {}).items()}
            ),
            notes=AgentNotes(
                prefix_held=data.get("prefix_held", {}),
                queued_counts=data.get("queued_counts", {}),
                standby_fetches={
                    i: (f[0], f[1]) for i, f in data.get("standby_fetches", {}).items()
                },
            ),
        )


def _group_from_dict(g: Mapping[str, Any]) -> PlannedGroup:
    return PlannedGroup(
        g["group_id"],
        g["model"],
        g["slo_class"],
        tuple(g["request_ids"]),
        tuple(g.get("prompt_tokens", ())),
        tuple(g.get("max_output_tokens", ())),
        tuple(g.get("slo_classes", ())),
        tuple(g.get("ttft_deadlines_at_s", ())),
        tuple(g.get("arrivals_at_s", ())),
        tuple(g.get("job_orders", ())),
        tuple(g.get("job_leaders", ())),
    )
