"""Work-conserving dispatch within the plan: what an instance pulls the moment it has room.

The plan is the long view (which model each instance runs, which swaps, in which order);
dispatch is the short view. An instance that keeps its model serves every queued request of
that model, whichever instance the plan listed it under, so no instance idles while work it
could serve waits for a busier one (a greedy router never beats that).

The order answers "which requests can still be kept, and which first?" exactly as the
single-machine problem of meeting the most deadlines is solved (Moore and Hodgson, 1968;
optimal for 1||sum U_j): the instances on a model are one machine whose speed is the sum of
theirs; a request costs its share of that machine (`PoolRate.cost_s`: its prefill plus its
decode steps shared with a batch of its peers, whose size its KV need bounds, so a long
prompt costs what it really takes); its first token is due by its TTFT deadline, so it must
start by the deadline less its prefill. Requests go in that order of due start; whenever one
would start late, the costliest request kept so far is dropped to the back. What remains is
the largest set of requests that can all meet their deadlines, served earliest-due first;
the dropped ones, and any already past their deadline, come after them (they miss whatever
happens; serving them first would only make the next ones late too: EDF's domino effect).
Under overload this sheds the work that costs most per promise kept, not a class by rank.

An instance follows the plan away from its model (a swap) only when no queued request of its
model would be stranded: the plan lists none of them under this instance, and another
instance the plan keeps on that model takes the rest, or none are queued. A swap that would
leave a model's only server during its burst is never taken.

Pure functions over the plan and the queue's members; the live agent and the simulator call
the same ones (the simulator keeps the schedule between arrivals, `ModelQueues`).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from qlm.agents.job_gate import LeaderGate
from qlm.agents.pacing import Pacing
from qlm.agents.reconcile import QueuedGroup, QueuedItem
from qlm.agents.virtual_queue import planned_items
from qlm.control.plan import PublishedPlan
from qlm.perf.profile import Profile
from qlm.prefixes.affinity import HOLD
from qlm.types import Fleet

LATE_CLASS = "late"  # the class dispatch gives requests it cannot keep (ranks lowest)
MEMO_ENTRIES = 1 << 16  # distinct request shapes a pool keeps priced
UNCHECKED = (math.inf, 0.0)  # (due, cost) of a request the schedule did not check: never due


@dataclass(frozen=True, slots=True)
class PoolMember:
    """One instance on the model: its profile, KV capacity and sequence slots."""

    profile: Profile
    kv_capacity_tokens: int
    max_num_seqs: int

    def cost_s(self, prompt_tokens: int, output_tokens: int) -> tuple[float, float]:
        """(instance-seconds the request takes, its prefill seconds). Decode steps are shared
        with a batch of peers like it: as many as its KV need and the slots allow."""
        profile = self.profile
        prefill_s = profile.prefill_s(prompt_tokens)
        per_seq = max(1, prompt_tokens + output_tokens)
        batch = max(1, min(self.max_num_seqs, self.kv_capacity_tokens // per_seq))
        decode_s = output_tokens * profile.decode_step_s_at(batch) / batch
        return prefill_s + decode_s, prefill_s


@dataclass(frozen=True, slots=True)
class PoolRate:
    """The instances on one model, seen as one machine (their speeds add up)."""

    members: tuple[PoolMember, ...]
    # The distinct members (alike instances price a request alike) and each member's index
    # among them: a request is priced once per kind, then summed over the members in order.
    _kinds: tuple[PoolMember, ...] = field(init=False, repr=False, compare=False)
    _kind_of: tuple[int, ...] = field(init=False, repr=False, compare=False)
    # `cost_s` by (prompt tokens, output tokens): requests of a job or a trace repeat them.
    _memo: dict[tuple[int, int], tuple[float, float]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        index: dict[tuple[int, int, int], int] = {}
        kinds: list[PoolMember] = []
        kind_of = []
        for member in self.members:
            key = (id(member.profile), member.kv_capacity_tokens, member.max_num_seqs)
            if key not in index:
                index[key] = len(kinds)
                kinds.append(member)
            kind_of.append(index[key])
        object.__setattr__(self, "_kinds", tuple(kinds))
        object.__setattr__(self, "_kind_of", tuple(kind_of))
        object.__setattr__(self, "_memo", {})

    @classmethod
    def of(cls, fleet: Fleet, instance_ids: Iterable[str], model: str) -> PoolRate:
        """The pool of these instances serving `model` (those without its profile left
        out), from the fleet's profiles alone, so live agents and the simulator agree."""
        members = []
        for instance_id in instance_ids:
            instance = fleet.instance(instance_id)
            profile = fleet.profile(model, instance)
            if profile is not None:
                kv_tokens = profile.kv_capacity_tokens(instance.gpu_memory_bytes)
                members.append(PoolMember(profile, kv_tokens, profile.max_batch_size))
        return cls(tuple(members))

    def cost_s(self, item: QueuedItem) -> tuple[float, float]:
        """(seconds of the whole pool the request takes, its mean prefill seconds)."""
        key = (item.prompt_tokens, item.max_output_tokens)
        known = self._memo.get(key)
        if known is None:
            if len(self._memo) >= MEMO_ENTRIES:
                self._memo.clear()
            known = self._memo[key] = self._cost_s(*key)
        return known

    def _cost_s(self, prompt_tokens: int, output_tokens: int) -> tuple[float, float]:
        kind_of = self._kind_of
        if not kind_of:
            return math.inf, math.inf
        costs = [k.cost_s(prompt_tokens, output_tokens) for k in self._kinds]
        speeds = [1.0 / max(c, 1e-9) for c, _ in costs]
        pool_s = 1.0 / sum(speeds[k] for k in kind_of)
        return pool_s, sum(costs[k][1] for k in kind_of) / len(kind_of)


@dataclass(frozen=True, slots=True)
class Schedule:
    """The requests of one model that can all meet their deadlines, in the order they are
    due to start (`kept`), and those that cannot (`dropped`), by deadline."""

    kept: tuple[QueuedItem, ...]
    dropped: tuple[QueuedItem, ...]
    # When each checked kept request is due to start on the pool seen as one machine (its
    # first token: that plus its prefill plus the engine work that blocks its class).
    start_at_s: Mapping[str, float] = field(default_factory=dict)
    # Each checked kept request's due time (when it must be done on the pool) and cost there
    # (qlm/agents/pacing.py reads them).
    due_and_cost: Mapping[str, tuple[float, float]] = field(default_factory=dict)


# (due start plus cost: when it must be done on the pool to start in time, the tie-break
# (request id, or its key in a planned job's order), cost on the pool in seconds, the item)
Job = tuple[float, str, float, QueuedItem]


def job_of(item: QueuedItem, rate: PoolRate) -> Job:
    """A request's place in the schedule. A planned batch job's request is due done by its
    deadline (the job's window bounds its whole output, not only its first token), so all
    the job's requests are due alike and go in the job's planned order
    (qlm/prefixes/job_plan.py: by shared prefix, long decodes first)."""
    cost_s, prefill_s = rate.cost_s(item)
    if item.job_order is not None:
        return item.ttft_deadline_at_s, item.job_order, cost_s, item
    return item.ttft_deadline_at_s - prefill_s + cost_s, item.request_id, cost_s, item


def schedule(
    items: Iterable[QueuedItem], rate: PoolRate, now_s: float, max_jobs: int | None = None
) -> Schedule:
    """Moore-Hodgson over the pool: keep the most requests that can start by their
    deadline less their prefill; drop the costliest whenever one would be late."""
    return schedule_jobs(sorted(job_of(item, rate) for item in items), now_s, max_jobs)


def schedule_jobs(jobs: Sequence[Job], now_s: float, max_jobs: int | None = None) -> Schedule:
    """`schedule` over jobs sorted by due time. Only the first `max_jobs` are checked (the
    head of the queue decides what starts now; the rest follow in due order, and a new
    schedule is made as requests come)."""
    checked = jobs if max_jobs is None else jobs[:max_jobs]
    return schedule_checked(checked, [job[3] for job in jobs[len(checked) :]], now_s)


def moore_hodgson(
    jobs: Iterable[Job], now_s: float
) -> tuple[list[tuple[float, str, float, QueuedItem]], list[QueuedItem]]:
    """(the kept as a heap of (-cost, tie-break, due, item), the dropped in the order dropped):
    jobs in due order, each kept; whenever one would end past its due time, the costliest
    kept so far is dropped."""
    kept: list[tuple[float, str, float, QueuedItem]] = []  # heap: costliest first
    dropped: list[QueuedItem] = []
    done_s = now_s
    for due_s, tie_break, cost_s, item in jobs:
        heapq.heappush(kept, (-cost_s, tie_break, due_s, item))
        done_s += cost_s
        if done_s > due_s:
            neg_cost_s, _, _, worst = heapq.heappop(kept)
            done_s += neg_cost_s
            dropped.append(worst)
    return kept, dropped


def schedule_checked(
    checked: Sequence[Job],
    rest: Sequence[QueuedItem],
    now_s: float,
    hopeless: Sequence[QueuedItem] = (),
) -> Schedule:
    """Moore-Hodgson over `checked` (sorted by due time); `rest` follows the kept, as is;
    `hopeless` (late whatever happens) follow the dropped."""
    kept, dropped = moore_hodgson(checked, now_s)
    start_at_s: dict[str, float] = {}
    due_and_cost: dict[str, tuple[float, float]] = {}
    in_order: list[QueuedItem] = []
    at_s = now_s
    for neg_cost_s, _, due_s, item in sorted(kept, key=lambda job: (job[2], job[1])):
        start_at_s[item.request_id] = at_s
        due_and_cost[item.request_id] = (due_s, -neg_cost_s)
        at_s -= neg_cost_s
        in_order.append(item)
    in_order.extend(rest)
    dropped.sort(key=lambda it: (it.ttft_deadline_at_s, it.request_id))
    return Schedule(tuple(in_order), (*dropped, *hopeless), start_at_s, due_and_cost)


def dispatch_groups(
    model: str,
    plan: Schedule,
    now_s: float,
    limit: int,
    is_queued: Callable[[str], bool] = lambda _: True,
    affinity: Callable[[QueuedItem], int] | None = None,
    prefilling: Collection[str] = frozenset(),
) -> tuple[QueuedGroup, ...]:
    """The instance's dispatch queue for its model: the kept requests still queued and not
    yet past their deadline, in order, then the rest (dropped or late) as the lowest class.
    At most `limit` requests in all (what one reconcile round can pull). With `affinity`
    (prefix locality, `by_affinity`) the on-time requests, and the rest, are reordered for
    this instance. A planned batch job's request waits while its part's leader is queued or
    among this engine's `prefilling` requests, and the job's later ones with it
    (qlm/agents/job_gate.py: the leader computes the shared prefix once)."""
    on_time: list[QueuedItem] = []
    late: list[QueuedItem] = []
    gate = LeaderGate(prefilling)
    held = 0  # of those listed, held back by the gate (they do not count against `limit`)
    for item in plan.kept:
        if len(on_time) - held >= limit:
            break
        if is_queued(item.request_id):
            held += gate.saw(item)
            (on_time if item.ttft_deadline_at_s >= now_s else late).append(item)
    for item in plan.dropped:
        if len(on_time) + len(late) - held >= limit:
            break
        if is_queued(item.request_id):
            held += gate.saw(item)
            late.append(item)
    if affinity is not None:  # the late ones too: the schedule prices no cached prefill
        on_time = by_affinity(on_time, affinity, plan.due_and_cost, now_s)
        late = by_affinity(late, affinity)
    on_time, late = gate.cut(on_time), gate.cut(late)
    groups = []
    if on_time:
        groups.append(QueuedGroup(f"dispatch:{model}", model, "", tuple(on_time), True))
    room = limit - len(on_time)
    late_items = tuple(_as_late(it) for it in late[:room])
    if late_items:
        groups.append(QueuedGroup(f"dispatch:{model}:{LATE_CLASS}", model, "", late_items, True))
    return tuple(groups)


def by_affinity(
    items: Sequence[QueuedItem],
    affinity: Callable[[QueuedItem], int],
    due_and_cost: Mapping[str, tuple[float, float]] | None = None,
    now_s: float = -math.inf,
) -> list[QueuedItem]:
    """Prefix locality within the schedule (after Preble's exploit rule), for one instance:
    `affinity` is +1 for a request whose prompt this instance holds more of than it would
    compute (it is cheapest here), -1 for one another instance holds so (cheapest there),
    0 otherwise. The schedule decides which requests are kept (these on-time ones); locality
    decides who serves which first: this instance's own, then the rest, then another's, each
    in schedule order, so an instance serves what it holds first and leaves another's to it
    (work-conserving: a hot prefix spills over). A request another instance holds and is
    still worth waiting for (`HOLD`, qlm/prefixes/affinity.py) is left out.

    Locality never makes the most urgent request late: with the schedule's `due_and_cost`
    (when each kept request must be done on the pool, and its cost there), the next request
    in locality order goes first only if the earliest-due request left could still be done
    by its due time after it, counted on the pool from `now_s`; otherwise that one goes
    first. Without this, a steady stream of requests an instance holds starves one it does
    not (a hot prefix's requests whose own text outweighs the shared part: nobody "owns"
    them, so every instance serves them last, and they wait until the stream stops). The
    check looks one request ahead for the earliest-due one only (O(n)); a later-due request
    is protected once it is the earliest left, not before."""
    own: list[QueuedItem] = []
    rest: list[QueuedItem] = []
    theirs: list[QueuedItem] = []
    in_schedule: list[QueuedItem] = []
    for item in items:
        side = affinity(item)
        if side == HOLD:
            continue
        in_schedule.append(item)
        (own if side > 0 else theirs if side < 0 else rest).append(item)
    local = own + rest + theirs
    if not due_and_cost:
        return local
    return _urgent_first(local, in_schedule, due_and_cost, now_s)


def _urgent_first(
    local: Sequence[QueuedItem],
    in_schedule: Sequence[QueuedItem],
    due_and_cost: Mapping[str, tuple[float, float]],
    now_s: float,
) -> list[QueuedItem]:
    """`local` (locality order), except that whenever its next request would leave the
    earliest-due request not yet placed (`in_schedule` is in due order) unable to be done by
    its due time, that request is placed first. Requests the schedule did not check (no
    due time) never force a place."""
    placed: set[str] = set()
    out: list[QueuedItem] = []
    at_s = now_s
    head = 0  # the earliest-due request not yet placed, in `in_schedule`
    for item in local:
        while item.request_id not in placed:
            while head < len(in_schedule) and in_schedule[head].request_id in placed:
                head += 1
            urgent = in_schedule[head] if head < len(in_schedule) else item
            due = due_and_cost.get(urgent.request_id)
            cost_s = due_and_cost.get(item.request_id, UNCHECKED)[1]
            if urgent is not item and due is not None and at_s + cost_s + due[1] > due[0]:
                chosen = urgent  # locality would make it late: it goes first
            else:
                chosen = item
            placed.add(chosen.request_id)
            out.append(chosen)
            at_s += due_and_cost.get(chosen.request_id, UNCHECKED)[1]
    return out


def _as_late(item: QueuedItem) -> QueuedItem:
    return QueuedItem(
        item.request_id,
        item.prompt_tokens,
        item.max_output_tokens,
        LATE_CLASS,
        item.ttft_deadline_at_s,
    )


def plan_items(
    plan: PublishedPlan, model: str, is_queued: Callable[[str], bool]
) -> list[QueuedItem]:
    """The queued members of every planned group of `model`, across all instances, each
    once (the live agent's view: the plan as published lists each queue's head)."""
    return [it for rid, it in planned_items(plan, model, {}).items() if is_queued(rid)]


def follows_swap(
    model: str | None,
    planned: Sequence[QueuedGroup],
    model_queued: int,
    swap_pays: Callable[[], bool],
) -> bool:
    """Whether the instance follows its plan to another model now. `planned` is its virtual
    queue (plan order), `model_queued` the queued requests of its loaded model, `swap_pays`
    whether the swap keeps more promises than it breaks (`Dispatcher.swap_pays`,
    qlm/agents/decision.py). An empty instance loads what the plan puts first."""
    if not planned:
        return False
    if model is None:
        return True
    if planned[0].model == model:
        return False
    if model_queued and any(g.model == model for g in planned):
        return False  # the plan comes back to this model here: serve it first
    return swap_pays()


def unseen_paced(
    plan: PublishedPlan, model: str, items: Iterable[QueuedItem], pacing: Pacing | None
) -> int:
    """Queued requests of paced classes of `model` that the published head does not show
    (`PublishedPlan.notes.queued_counts`): their work counts when pacing."""
    if pacing is None:
        return 0
    counts = plan.notes.queued_counts.get(model, {})
    queued = sum(counts.get(name, 0) for name in pacing.classes)
    return max(0, queued - sum(it.slo_class in pacing.classes for it in items))
