"""Planning a batch job as a whole (after BatchLLM): the whole job is known when it is
submitted, so its shared prefixes are found over all its prompts at once, not left to the
luck of an LRU cache seeing them one by one.

1. **Prefix tree.** Every prompt's leading blocks (`Request.prefix`; a block's key names the
   prompt up to its end, so equal keys are equal text so far) form a tree; a node is *shared*
   when two or more prompts pass through it.
2. **Groups by prefix.** Each request joins the group of the deepest shared node on its
   prompt: the longest prefix it has in common with another request of the job (a request
   with none joins the job's group of unshared prompts). Computing a group's prefix once
   serves all its members.
3. **Order.** Groups are laid out depth first over the shared tree, so everything under one
   prefix runs together and the prefix is computed once while it is needed; siblings are
   ordered by decode ratio (output tokens over the prompt tokens computed), highest first:
   long decodes start early, where later prefill-heavy work fills the batches beside them,
   instead of trailing alone at the end of the job. Within a group, longest output first.
4. **Batches by tokens and memory.** A group is cut, in that order, into parts an engine can
   hold at once: the prefix once plus each member's own prompt and output within
   `PlanBudget.kv_tokens`, at most `PlanBudget.max_requests` members. Runs of consecutive
   parts up to the grouping's largest group (`PlanBudget.group_requests`) are the groups
   the planner places
   (`Request.job_group`); the parts' order is the order dispatch serves the job in
   (`Request.job_order`).
5. **The prefix once.** A part's first member leads (`Request.job_leader` of the others):
   an engine computes a prompt's blocks and caches them when its prefill ends, so members
   admitted beside their leader would each compute the prefix again. The leader is the
   member with the shortest output (its first token comes soonest and it is the last one
   the schedule drops under overload); dispatch holds the others while it is queued or
   prefilling on the engine that pulled it (qlm/agents/job_gate.py), and the prefix
   locality of qlm/prefixes/affinity.py leaves them to that engine.

Pure and deterministic: the same job gives the same plan, so a runner that repeats a step
after a restart plans it alike.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from qlm.types import Fleet, Request

ROOT = -1  # the tree's root: requests sharing nothing with another hang here
UNBOUNDED = 1 << 62


@dataclass(frozen=True, slots=True)
class PlanBudget:
    """What one engine batch may hold: KV tokens and sequences (the smallest instance that
    serves the job's model, so every part fits wherever the planner puts it); and how many
    requests one planning group holds (the grouping's `max_group_size`)."""

    kv_tokens: int
    max_requests: int
    group_requests: int = UNBOUNDED

    def __post_init__(self) -> None:
        if min(self.kv_tokens, self.max_requests, self.group_requests) < 1:
            raise ValueError("a plan budget's fields must be >= 1")


def job_budget(fleet: Fleet, model: str, group_requests: int = UNBOUNDED) -> PlanBudget:
    """The budget of the smallest instance of the fleet that serves `model` (its KV capacity
    and batch size, by its profile); unbounded when none does (nothing runs the job then).
    `group_requests`: the grouping's largest group."""
    budgets = []
    for instance in fleet.instances:
        profile = fleet.profile(model, instance)
        if profile is not None:
            kv_tokens = profile.kv_capacity_tokens(instance.gpu_memory_bytes)
            budgets.append(PlanBudget(max(1, kv_tokens), profile.max_batch_size, group_requests))
    if not budgets:
        return PlanBudget(UNBOUNDED, UNBOUNDED, group_requests)
    return min(budgets, key=lambda b: (b.kv_tokens, b.max_requests))


@dataclass(frozen=True, slots=True)
class JobPart:
    """One part of a job: members in serving order, sharing `shared_tokens` prompt tokens."""

    label: str
    request_ids: tuple[str, ...]
    shared_tokens: int
    kv_tokens: int  # the prefix once plus every member's own prompt and output


@dataclass(frozen=True, slots=True)
class JobPlan:
    job_id: str
    parts: tuple[JobPart, ...]  # in serving order
    group_size: int  # consecutive parts are planned together up to this many requests

    def order(self) -> dict[str, tuple[str, str, str | None]]:
        """request id -> (its planning group, its order key within the job, its part's
        leader: the first member, which computes the shared prefix; None for the leader
        itself and where the part shares nothing). A planning group is a run of consecutive
        parts of at most `group_size` requests (a part larger than that is one alone): the
        planner places groups, dispatch serves parts, and a group per part would grow the
        planner's problem with the job's prefixes."""
        out: dict[str, tuple[str, str, str | None]] = {}
        rank = group = in_group = 0
        for part in self.parts:
            size = len(part.request_ids)
            if in_group and in_group + size > self.group_size:
                group, in_group = group + 1, 0
            in_group += size
            leader = part.request_ids[0] if part.shared_tokens else None
            for request_id in part.request_ids:
                follows = None if request_id == leader else leader
                out[request_id] = (f"{self.job_id}/g{group}", f"{rank:09d}", follows)
                rank += 1
        return out


@dataclass(slots=True)
class _Node:
    tokens: int  # this block's
    depth_tokens: int  # from the prompt's start to this block's end
    count: int = 0  # prompts through this node
    children: dict[int, None] = dataclasses.field(default_factory=dict)  # insertion order


def plan_job(job_id: str, requests: Sequence[Request], budget: PlanBudget) -> JobPlan:
    """The job's parts in serving order (the steps in the module docstring)."""
    nodes = _tree(requests)
    groups: dict[int, list[Request]] = defaultdict(list)
    for request in requests:
        groups[_sharing_node(request, nodes)].append(request)
    parts: list[JobPart] = []
    for key in _group_order(nodes, groups):
        members = sorted(groups[key], key=lambda r: (-r.max_output_tokens, -r.prompt_tokens, r.id))
        shared = nodes[key].depth_tokens if key != ROOT else 0
        for chunk, kv_tokens in _cut(members, shared, budget):
            label = f"{job_id}/p{len(parts)}"
            parts.append(JobPart(label, _leader_first(chunk), shared, kv_tokens))
    return JobPlan(job_id, tuple(parts), budget.group_requests)


def with_plan(requests: Iterable[Request], plan: JobPlan, job_id: str) -> list[Request]:
    """The requests carrying their place in the plan (`job_group`, `job_order`)."""
    order = plan.order()
    out = []
    for request in requests:
        label, rank, leader = order[request.id]
        out.append(
            dataclasses.replace(
                request, job_group=label, job_order=f"{job_id}#{rank}", job_leader=leader
            )
        )
    return out


def _tree(requests: Sequence[Request]) -> dict[int, _Node]:
    nodes: dict[int, _Node] = {ROOT: _Node(0, 0)}
    for request in requests:
        parent, depth = ROOT, 0
        for block in request.prefix:
            depth += block.tokens
            node = nodes.get(block.key)
            if node is None:
                node = nodes[block.key] = _Node(block.tokens, depth)
                nodes[parent].children[block.key] = None
            node.count += 1
            parent = block.key
    return nodes


def _sharing_node(request: Request, nodes: Mapping[int, _Node]) -> int:
    """The deepest node on the request's prompt that another request of the job shares."""
    found = ROOT
    for block in request.prefix:
        if nodes[block.key].count < 2:
            break
        found = block.key
    return found


def _group_order(nodes: Mapping[int, _Node], groups: Mapping[int, list[Request]]) -> list[int]:
    """Group keys depth first over the shared tree, siblings (a node's own group and its
    shared children's subtrees) by decode ratio, highest first."""

    def visit(key: int) -> tuple[list[int], int, int]:  # (group keys, outputs, computed)
        units: list[tuple[list[int], int, int]] = []
        own = groups.get(key, [])
        if own:
            depth = nodes[key].depth_tokens
            outputs = sum(r.max_output_tokens for r in own)
            units.append(([key], outputs, sum(r.prompt_tokens - depth for r in own)))
        for child in nodes[key].children:
            if nodes[child].count >= 2:
                keys, outputs, computed = visit(child)
                if keys:
                    units.append((keys, outputs, computed + nodes[child].tokens))
        units.sort(key=lambda u: (-u[1] / max(1, u[2]), -u[1], u[0][0]))
        order = [k for unit in units for k in unit[0]]
        return order, sum(u[1] for u in units), sum(u[2] for u in units)

    return visit(ROOT)[0]


def _leader_first(chunk: Sequence[Request]) -> tuple[str, ...]:
    """The part's ids, its leader (the shortest output; the last such) first, the rest in
    order."""
    leader = min(reversed(range(len(chunk))), key=lambda i: chunk[i].max_output_tokens)
    return (chunk[leader].id, *(r.id for i, r in enumerate(chunk) if i != leader))


def _cut(
    members: Sequence[Request], shared_tokens: int, budget: PlanBudget
) -> list[tuple[list[Request], int]]:
    """Consecutive parts, each the prefix once plus its members' own prompt and output
    within the budget (a member too big on its own gets a part of its own)."""
    parts: list[tuple[list[Request], int]] = []
    chunk: list[Request] = []
    kv_tokens = shared_tokens
    for request in members:
        own = request.prompt_tokens - shared_tokens + request.max_output_tokens
        full = len(chunk) >= budget.max_requests or kv_tokens + own > budget.kv_tokens
        if chunk and full:
            parts.append((chunk, kv_tokens))
            chunk, kv_tokens = [], shared_tokens
        chunk.append(request)
        kv_tokens += own
    if chunk:
        parts.append((chunk, kv_tokens))
    return parts
