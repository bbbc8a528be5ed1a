"""The planning MILP, written once in a solver-neutral form (constraints labelled C1..C9 as in
qlm/solver/README.md); backends only translate it.

x[q,g,s]  group g in slot s of instance q's virtual queue         (binary)
t[q,s,k]  instance q switches to model k just before slot s      (binary)
W[q,s]    start of slot s on q, seconds from now                  (continuous >= 0)
C[g]      TTFT of g's last request at the planning percentile     (continuous >= 0)
L[g]      TTFT lateness of g, a penalised slack                   (continuous >= 0)
Lc[g]     completion lateness of g (only groups with such a deadline)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from qlm.solver.costs import CostTable, evaluate


class Sense(StrEnum):
    LE = "<="
    GE = ">="
    EQ = "=="


@dataclass(frozen=True, slots=True)
class Var:
    name: str
    binary: bool
    lb: float
    ub: float


@dataclass(frozen=True, slots=True)
class Constraint:
    """sum(coef * var) SENSE rhs; when `enforce` is a binary var, only if it is 1 (backends
    with indicator constraints use it directly, others add big_m * (1 - var))."""

    label: str
    terms: tuple[tuple[int, float], ...]
    sense: Sense
    rhs: float
    enforce: int | None = None
    big_m: float = 0.0


@dataclass
class Formulation:
    table: CostTable
    num_slots: int
    vars: list[Var] = field(default_factory=list)
    constraints: list[Constraint] = field(default_factory=list)
    objective: dict[int, float] = field(default_factory=dict)
    x: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (q, g, s) -> var
    t: dict[tuple[int, int, str], int] = field(default_factory=dict)  # (q, s, model) -> var
    w: dict[tuple[int, int], int] = field(default_factory=dict)  # (q, s) -> var
    c: dict[int, int] = field(default_factory=dict)
    late: dict[int, int] = field(default_factory=dict)
    late_completion: dict[int, int] = field(default_factory=dict)
    by_slot: dict[tuple[int, int], list[tuple[int, int]]] = field(default_factory=dict)
    by_group: dict[int, list[tuple[int, int, int]]] = field(default_factory=dict)
    horizon_s: dict[int, float] = field(default_factory=dict)  # q -> latest possible start
    min_occupancy_s: dict[int, float] = field(default_factory=dict)  # q -> its shortest group
    models: dict[int, list[str]] = field(default_factory=dict)  # q -> models it can serve

    def add_var(self, name: str, binary: bool, lb: float = 0.0, ub: float = 1.0) -> int:
        self.vars.append(Var(name, binary, lb, ub))
        return len(self.vars) - 1

    def add(self, constraint: Constraint) -> None:
        self.constraints.append(constraint)

    def queues_from(self, values: Sequence[float]) -> list[list[int]]:
        """Read the virtual queues out of a solution vector."""
        queues: list[list[tuple[int, int]]] = [[] for _ in range(self.table.num_instances)]
        for (q, g, s), v in self.x.items():
            if values[v] > 0.5:
                queues[q].append((s, g))
        return [[g for _, g in sorted(slots)] for slots in queues]

    def values_for(self, queues: Sequence[Sequence[int]]) -> list[float]:
        """A full solution vector for given queues (the warm start)."""
        values = [0.0] * len(self.vars)
        for q, queue in enumerate(queues):
            for s, g in enumerate(queue):
                values[self.x[(q, g, s)]] = 1.0
        score = evaluate(self.table, queues)
        for q, queue in enumerate(queues):
            self._fill_queue_values(values, q, queue)
        for g, group in enumerate(self.table.groups):
            pred = score.predictions[group.id]
            values[self.c[g]] = max(0.0, pred.ttft_s)
            values[self.late[g]] = pred.ttft_late_s
            if g in self.late_completion:
                values[self.late_completion[g]] = pred.completion_late_s
        return values

    def _fill_queue_values(self, values: list[float], q: int, queue: Sequence[int]) -> None:
        table = self.table
        start = table.base_s[q]
        model = table.instances[q].loaded_model
        for s in range(self.num_slots):
            g = queue[s] if s < len(queue) else None
            if g is not None and table.groups[g].model != model:
                model = table.groups[g].model
                values[self.t[(q, s, model)]] = 1.0
                start += table.swap_s[(model, q)]
            values[self.w[(q, s)]] = start
            if g is not None:
                start += table.costs[(g, q)].occupancy_s


def formulate(table: CostTable, num_slots: int) -> Formulation:
    """Build the MILP for a cost table with `num_slots` slots per virtual queue."""
    f = Formulation(table, num_slots)
    for q in range(table.num_instances):
        f.models[q] = _models_on(table, q)
    _assignment_vars(f)
    _transition_vars(f)
    for q in range(table.num_instances):
        _slot_constraints(f, q)
        _start_times(f, q)
    for g in range(table.num_groups):
        _group_constraints(f, g)
    return f


def _allowed_slots(table: CostTable, g: int, q: int, num_slots: int) -> range:
    """Pinned groups sit at their fixed head position; others only after the pinned ones."""
    head = table.pinned.get(q, ())
    if g in head:
        s = head.index(g)
        return range(s, s + 1)
    if table.pinned_on(g) is not None:
        return range(0)
    return range(len(head), num_slots)


def _assignment_vars(f: Formulation) -> None:
    table = f.table
    for g, q in sorted(table.costs):
        pinned = table.pinned_on(g) == q
        for s in _allowed_slots(table, g, q, f.num_slots):
            v = f.add_var(f"x_{q}_{g}_{s}", binary=True, lb=1.0 if pinned else 0.0)
            f.x[(q, g, s)] = v
            f.by_slot.setdefault((q, s), []).append((g, v))
            f.by_group.setdefault(g, []).append((q, s, v))
    for g in range(table.num_groups):
        terms = tuple((v, 1.0) for _, _, v in f.by_group.get(g, []))
        f.add(Constraint("C1", terms, Sense.EQ, 1.0))  # C1: each group in exactly one slot


def _models_on(table: CostTable, q: int) -> list[str]:
    return sorted({table.groups[g].model for (g, qq) in table.costs if qq == q})


def _transition_vars(f: Formulation) -> None:
    table = f.table
    for q in range(table.num_instances):
        loaded = table.instances[q].loaded_model
        for s in range(f.num_slots):
            for model in f.models[q]:
                if s == 0 and model == loaded:
                    continue  # already loaded: no transition possible into it at the head
                f.t[(q, s, model)] = f.add_var(f"t_{q}_{s}_{model}", binary=True)


def _slot_terms(f: Formulation, q: int, s: int, model: str | None = None) -> list[int]:
    groups = f.table.groups
    return [v for g, v in f.by_slot.get((q, s), []) if model is None or groups[g].model == model]


def _slot_constraints(f: Formulation, q: int) -> None:
    for s in range(f.num_slots):
        here = _slot_terms(f, q, s)
        f.add(Constraint("C2", tuple((v, 1.0) for v in here), Sense.LE, 1.0))  # C2: one group
        if s + 1 < f.num_slots:
            nxt = _slot_terms(f, q, s + 1)
            terms = tuple([(v, 1.0) for v in nxt] + [(v, -1.0) for v in here])
            f.add(Constraint("C3", terms, Sense.LE, 0.0))  # C3: slots fill from the head
    for s in range(f.num_slots):
        _transition_constraints(f, q, s)


def _transition_constraints(f: Formulation, q: int, s: int) -> None:
    for model in f.models[q]:
        tv = f.t.get((q, s, model))
        if tv is None:
            continue
        now = [(v, -1.0) for v in _slot_terms(f, q, s, model)]
        before = [(v, 1.0) for v in _slot_terms(f, q, s - 1, model)] if s > 0 else []
        # C4: a transition into `model` at s when s holds it and s-1 (or the loaded model) not
        f.add(Constraint("C4", ((tv, 1.0), *now, *before), Sense.GE, 0.0))


def _max_start_s(f: Formulation, q: int) -> float:
    if q not in f.horizon_s:
        f.horizon_s[q] = _horizon(f, q)
    return f.horizon_s[q]


def _horizon(f: Formulation, q: int) -> float:
    table = f.table
    occ = sorted((c.occupancy_s for (g, qq), c in table.costs.items() if qq == q), reverse=True)
    swaps = [s for (m, qq), s in table.swap_s.items() if qq == q]
    return table.base_s[q] + sum(occ[: f.num_slots]) + f.num_slots * max(swaps, default=0.0)


def _start_times(f: Formulation, q: int) -> None:
    table = f.table
    horizon = _max_start_s(f, q)
    for s in range(f.num_slots):
        f.w[(q, s)] = f.add_var(f"W_{q}_{s}", binary=False, lb=0.0, ub=horizon)
    for s in range(f.num_slots):
        swap = [(f.t[(q, s, m)], -table.swap_s[(m, q)]) for m in f.models[q] if (q, s, m) in f.t]
        if s == 0:
            terms = ((f.w[(q, 0)], 1.0), *swap)
            f.add(Constraint("C5", terms, Sense.GE, table.base_s[q]))  # C5: head start
            continue
        occ = [(v, -table.costs[(g, q)].occupancy_s) for g, v in f.by_slot.get((q, s - 1), [])]
        terms = ((f.w[(q, s)], 1.0), (f.w[(q, s - 1)], -1.0), *occ, *swap)
        # C5: start >= previous start + its work + swap (equality at any optimum: W only
        # bounds C and Lc from below, and both are minimised)
        f.add(Constraint("C5", terms, Sense.GE, 0.0))


def _group_constraints(f: Formulation, g: int) -> None:
    table = f.table
    group = table.groups[g]
    horizon = max(_max_start_s(f, q) for q in table.compatible(g))
    c_ub = horizon + _max_lag(table, g, "ttft_lag_s")
    f.c[g] = f.add_var(f"C_{g}", binary=False, lb=0.0, ub=c_ub)
    f.late[g] = f.add_var(f"L_{g}", binary=False, lb=0.0, ub=max(0.0, c_ub - table.deadline_s[g]))
    completion_deadline = table.completion_deadline_s[g]
    if completion_deadline is not None:
        ub = max(0.0, horizon + _max_lag(table, g, "completion_lag_s") - completion_deadline)
        f.late_completion[g] = f.add_var(f"Lc_{g}", binary=False, lb=0.0, ub=ub)
    for q, s, xv in f.by_group.get(g, []):
        cost = table.costs[(g, q)]
        big_m = _max_start_s(f, q) + cost.ttft_lag_s
        terms = ((f.c[g], 1.0), (f.w[(q, s)], -1.0))
        # C6: the group's TTFT is its slot's start plus its lag (when it is in that slot)
        f.add(Constraint("C6", terms, Sense.GE, cost.ttft_lag_s, enforce=xv, big_m=big_m))
        if completion_deadline is not None:
            rhs = cost.completion_lag_s - completion_deadline
            terms = ((f.late_completion[g], 1.0), (f.w[(q, s)], -1.0))
            big_m = _max_start_s(f, q) + max(0.0, rhs)
            # C8: completion lateness, a penalised slack
            f.add(Constraint("C8", terms, Sense.GE, rhs, enforce=xv, big_m=big_m))
    _position_bounds(f, g)
    # C7: TTFT lateness, a penalised slack (the paper's hard lateness <= 0, relaxed)
    terms = ((f.late[g], 1.0), (f.c[g], -1.0))
    f.add(Constraint("C7", terms, Sense.GE, -table.deadline_s[g]))
    n = float(group.size)
    f.objective[f.c[g]] = n
    f.objective[f.late[g]] = n * table.weight[g]
    if g in f.late_completion:
        f.objective[f.late_completion[g]] = n * table.weight[g]


def _min_occupancy_s(f: Formulation, q: int) -> float:
    if not f.min_occupancy_s:  # once for all instances: one pass over the cost table
        for (_, qq), cost in f.table.costs.items():
            f.min_occupancy_s[qq] = min(cost.occupancy_s, f.min_occupancy_s.get(qq, math.inf))
    return f.min_occupancy_s.get(q, 0.0)


def _position_bounds(f: Formulation, g: int) -> None:
    """C9 (valid inequality, no big-M): a group in slot s of q starts no earlier than q's busy
    time plus s groups' minimum occupancy. Redundant for integer points; it gives the LP
    relaxation and CP-SAT's propagation the lower bound the big-M rows of C6/C8 hide."""
    table = f.table
    ttft_terms: list[tuple[int, float]] = [(f.c[g], 1.0)]
    done_terms: list[tuple[int, float]] = []
    deadline = table.completion_deadline_s[g]
    for q, s, xv in f.by_group.get(g, []):
        earliest = table.base_s[q] + s * _min_occupancy_s(f, q)
        ttft_terms.append((xv, -(earliest + table.costs[(g, q)].ttft_lag_s)))
        if deadline is not None:
            done_terms.append((xv, -(earliest + table.costs[(g, q)].completion_lag_s - deadline)))
    f.add(Constraint("C9", tuple(ttft_terms), Sense.GE, 0.0))
    if deadline is not None:
        terms = ((f.late_completion[g], 1.0), *done_terms)
        f.add(Constraint("C9", terms, Sense.GE, 0.0))


def _max_lag(table: CostTable, g: int, which: str) -> float:
    return max(float(getattr(table.costs[(g, q)], which)) for q in table.compatible(g))
