"""MILP backends: each translates a Formulation for one solver and reads the answer back."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

from qlm.clock import Clock
from qlm.registry import Registry
from qlm.solver.milp.formulation import Constraint, Formulation, Sense


class SolveStatus(StrEnum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"
    TIMEOUT = "timeout"  # stopped by the time limit with a solution
    FAILED = "failed"  # no solution (infeasible, error, or time limit with nothing found)


@dataclass(frozen=True, slots=True)
class SolveOutcome:
    status: SolveStatus
    values: tuple[float, ...] | None
    wall_s: float
    detail: str = ""


class MilpBackend(Protocol):
    def solve(
        self,
        formulation: Formulation,
        time_limit_s: float,
        threads: int,
        warm_start: Sequence[float] | None,
        clock: Clock,
        deterministic_work: float | None = None,
    ) -> SolveOutcome: ...


MILP_BACKENDS: Registry[MilpBackend] = Registry("MILP backend")

# Time limits are enforced by the solvers; a run that used this share of its limit without
# proving optimality is reported as a timeout.
_TIMEOUT_SHARE = 0.95
# The solver gets this share of what is left of the limit after building the model; the rest
# covers reading the solution back and expanding the plan.
_SOLVE_SHARE = 0.85
_MIN_SOLVE_S = 0.05
# With a deterministic work budget, the wall limit is this multiple of the configured time
# limit: a safety net that a budget of about as many deterministic seconds never reaches.
_SAFETY_NET = 10.0


def _no_time_left(started: float, clock: Clock) -> SolveOutcome:
    wall_s = clock.monotonic_s() - started
    return SolveOutcome(
        SolveStatus.FAILED, None, wall_s, f"time limit spent building the model ({wall_s:.2f} s)"
    )


@dataclass(frozen=True, slots=True)
class _IntRow:
    terms: tuple[tuple[int, int], ...]
    sense: Sense
    rhs: int
    enforce: int | None


@MILP_BACKENDS.register("cpsat")
class CpSatBackend:
    """OR-Tools CP-SAT. Times become integer milliseconds; enforcement is native (indicator
    constraints, no big-M); the warm start becomes a complete solution hint."""

    SCALE = 1000.0  # seconds -> milliseconds
    OBJECTIVE_SCALE = 100.0  # keeps two decimals of fractional lateness weights

    def __init__(self) -> None:
        # Imported when the backend is made (the planner makes it once), not in `solve`,
        # whose time limit would pay the import; a process that never plans never imports.
        from ortools.sat.python import cp_model

        self._cp_model = cp_model

    def solve(
        self,
        formulation: Formulation,
        time_limit_s: float,
        threads: int,
        warm_start: Sequence[float] | None,
        clock: Clock,
        deterministic_work: float | None = None,
    ) -> SolveOutcome:
        cp_model = self._cp_model
        started = clock.monotonic_s()
        binary = [v.binary for v in formulation.vars]
        rows = [self._int_row(binary, con) for con in formulation.constraints]
        model = cp_model.CpModel()
        variables = [self._var(model, v.binary, v.lb, v.ub, v.name) for v in formulation.vars]
        for row in rows:
            ct = model.add(_bound(sum(c * variables[i] for i, c in row.terms), row.sense, row.rhs))
            if row.enforce is not None:
                ct.only_enforce_if(variables[row.enforce])
        model.minimize(
            sum(
                round(c * self.OBJECTIVE_SCALE) * variables[i]
                for i, c in formulation.objective.items()
            )
        )
        if warm_start is not None:
            lows = [self._low(v.binary, v.lb) for v in formulation.vars]
            for var, value in zip(
                variables, _complete_hint(rows, binary, warm_start, lows), strict=True
            ):
                model.add_hint(var, value)
        solver = cp_model.CpSolver()
        limit_s = _SOLVE_SHARE * (time_limit_s - (clock.monotonic_s() - started))
        if deterministic_work is not None:
            # Reproducible: a work budget on one worker with a fixed seed; the wall limit
            # (which does not depend on how long building took) is only a safety net.
            limit_s = _SAFETY_NET * time_limit_s
            solver.parameters.max_deterministic_time = deterministic_work
            solver.parameters.num_workers = 1
            solver.parameters.random_seed = 0
        elif limit_s < _MIN_SOLVE_S:
            return _no_time_left(started, clock)
        else:
            solver.parameters.num_workers = threads
        solver.parameters.max_time_in_seconds = limit_s
        # Presolve can use a whole sub-second budget on plans of realistic size before the
        # hint is even tried; without it the warm start is an incumbent at once.
        solver.parameters.cp_model_presolve = False
        code = solver.solve(model)
        wall_s = clock.monotonic_s() - started
        if code not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            return SolveOutcome(SolveStatus.FAILED, None, wall_s, solver.status_name(code))
        values = tuple(
            float(solver.value(var)) / (1.0 if fv.binary else self.SCALE)
            for var, fv in zip(variables, formulation.vars, strict=True)
        )
        optimal = code == cp_model.OPTIMAL
        status, detail = _cpsat_status(solver, code, optimal, limit_s, deterministic_work)
        return SolveOutcome(status, values, wall_s, detail)

    def _low(self, binary: bool, lb: float) -> int:
        return round(lb) if binary else math.floor(lb * self.SCALE)

    def _var(self, model: Any, binary: bool, lb: float, ub: float, name: str) -> Any:
        if binary:
            var = model.new_bool_var(name)
            if lb >= 1.0:
                model.add(var == 1)
            return var
        return model.new_int_var(self._low(False, lb), math.ceil(ub * self.SCALE) + 1, name)

    def _int_row(self, binary: list[bool], con: Constraint) -> _IntRow:
        """Constraints over times are in seconds: binaries' coefficients and the right-hand
        side scale to milliseconds (integer variables already count milliseconds)."""
        timed = not all(binary[i] for i, _ in con.terms)
        scale = self.SCALE if timed else 1.0
        terms = tuple((i, round(c * scale if binary[i] else c)) for i, c in con.terms)
        return _IntRow(terms, con.sense, _int_rhs(con.rhs * scale, con.sense), con.enforce)


def _int_rhs(rhs: float, sense: Sense) -> int:
    if sense is Sense.LE:
        return math.floor(rhs + 1e-9)
    if sense is Sense.GE:
        return math.ceil(rhs - 1e-9)
    return round(rhs)


def _complete_hint(
    rows: Sequence[_IntRow], binary: Sequence[bool], warm: Sequence[float], lows: Sequence[int]
) -> list[int]:
    """The warm start's binaries, with every integer variable at the least value its rows
    allow. Rows come in dependency order (a start before later starts, starts before group
    times, group times before lateness), so one pass settles every value."""
    values = [round(w) if b else low for w, b, low in zip(warm, binary, lows, strict=True)]
    for row in rows:
        if row.sense is not Sense.GE or (row.enforce is not None and values[row.enforce] == 0):
            continue
        free = [(i, c) for i, c in row.terms if not binary[i] and c == 1]
        if len(free) != 1:
            continue
        target = free[0][0]
        rest = sum(c * values[i] for i, c in row.terms if i != target)
        values[target] = max(values[target], row.rhs - rest)
    return values


def _bound(expr: Any, sense: Sense, rhs: int) -> Any:
    if sense is Sense.LE:
        return expr <= rhs
    if sense is Sense.GE:
        return expr >= rhs
    return expr == rhs


def _cpsat_status(
    solver: Any, code: Any, optimal: bool, limit_s: float, deterministic_work: float | None
) -> tuple[SolveStatus, str]:
    """Optimal, feasible or timeout: by wall time, or on a work budget by the work done (never
    by the wall clock), saying so if the wall-clock safety net stopped the search."""
    detail = str(solver.status_name(code))
    if deterministic_work is None:
        return _classify(optimal, solver.wall_time, limit_s), detail
    done = float(solver.deterministic_time)
    if not optimal and done < _TIMEOUT_SHARE * deterministic_work:
        detail += " (wall-clock safety net hit: this plan depends on the machine's speed)"
    return _classify(optimal, done, deterministic_work), detail


def _classify(optimal: bool, wall_s: float, limit_s: float) -> SolveStatus:
    if optimal:
        return SolveStatus.OPTIMAL
    if wall_s >= _TIMEOUT_SHARE * limit_s:
        return SolveStatus.TIMEOUT
    return SolveStatus.FEASIBLE


class _PulpBackend:
    """PuLP with CBC or HiGHS. Enforced constraints become big-M rows."""

    solver_name = ""

    def __init__(self) -> None:
        import pulp  # when made, as CpSatBackend's library

        self._pulp = pulp

    def solve(
        self,
        formulation: Formulation,
        time_limit_s: float,
        threads: int,
        warm_start: Sequence[float] | None,
        clock: Clock,
        deterministic_work: float | None = None,
    ) -> SolveOutcome:
        pulp = self._pulp
        started = clock.monotonic_s()
        prob = pulp.LpProblem("qlm_plan", pulp.LpMinimize)
        variables = [
            prob.add_variable(
                f"v{i}", v.lb, v.ub, cat=pulp.LpBinary if v.binary else pulp.LpContinuous
            )
            for i, v in enumerate(formulation.vars)
        ]
        prob += pulp.LpAffineExpression(
            [(variables[i], c) for i, c in formulation.objective.items()]
        )
        for k, con in enumerate(formulation.constraints):
            prob += _pulp_row(pulp, variables, con, f"{con.label}_{k}")
        if warm_start is not None:
            for var, value in zip(variables, warm_start, strict=True):
                var.setInitialValue(value)
        remaining = _SOLVE_SHARE * (time_limit_s - (clock.monotonic_s() - started))
        if remaining < _MIN_SOLVE_S:
            return _no_time_left(started, clock)
        solver = self._solver(pulp, remaining, threads, warm_start is not None)
        solve_started = clock.monotonic_s()
        try:
            prob.solve(solver)
        except pulp.PulpSolverError as exc:
            return SolveOutcome(SolveStatus.FAILED, None, clock.monotonic_s() - started, str(exc))
        wall_s = clock.monotonic_s() - started
        if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
            detail = pulp.LpStatus.get(prob.status, str(prob.status))
            return SolveOutcome(SolveStatus.FAILED, None, wall_s, detail)
        values = tuple(float(v.varValue or 0.0) for v in variables)
        # CBC and HiGHS stop early only when optimal; PuLP reports a solution found before the
        # time limit as "optimal" too, so a run that used its budget counts as a timeout.
        solve_s = wall_s - (solve_started - started)
        optimal = prob.sol_status == pulp.LpSolutionOptimal and solve_s < _TIMEOUT_SHARE * remaining
        status = SolveStatus.OPTIMAL if optimal else SolveStatus.TIMEOUT
        return SolveOutcome(status, values, wall_s, "")

    def _solver(self, pulp: Any, time_limit_s: float, threads: int, warm: bool) -> Any:
        raise NotImplementedError


def _pulp_row(pulp: Any, variables: list[Any], con: Constraint, name: str) -> Any:
    terms = [(variables[i], c) for i, c in con.terms]
    rhs = con.rhs
    if con.enforce is not None:
        # holds when enforce = 1: sum >= rhs - M (1 - x)  <=>  sum - M x >= rhs - M (GE rows)
        sign = 1.0 if con.sense is Sense.GE else -1.0
        terms.append((variables[con.enforce], -sign * con.big_m))
        rhs -= sign * con.big_m
    expr = pulp.LpAffineExpression(terms)
    if con.sense is Sense.LE:
        return pulp.LpConstraint(expr, pulp.LpConstraintLE, name, rhs)
    if con.sense is Sense.GE:
        return pulp.LpConstraint(expr, pulp.LpConstraintGE, name, rhs)
    return pulp.LpConstraint(expr, pulp.LpConstraintEQ, name, rhs)


@MILP_BACKENDS.register("pulp-cbc")
class PulpCbcBackend(_PulpBackend):
    def _solver(self, pulp: Any, time_limit_s: float, threads: int, warm: bool) -> Any:
        return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, threads=threads, warmStart=warm)


@MILP_BACKENDS.register("pulp-highs")
class PulpHighsBackend(_PulpBackend):
    """HiGHS through its Python API. PuLP passes no warm start to it (see README)."""

    def _solver(self, pulp: Any, time_limit_s: float, threads: int, warm: bool) -> Any:
        return pulp.HiGHS(msg=False, timeLimit=time_limit_s, threads=threads)
