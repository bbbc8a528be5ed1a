"""A clairvoyant upper bound on SLO attainment: no policy, however well informed, can do better.

`attainment_bound(fleet, requests, config)` knows the whole trace (arrival times, prompt and true
output lengths) and returns, overall and per SLO class, the largest share of requests that could
possibly meet their SLO on this fleet. It prices work exactly as the simulated engine does
(qlm/engine/model/core.py, scheduler.py, segment.py and the profiles' step-time model in
qlm/perf/step.py), with the default engine settings unless `engine` says otherwise, and assumes
the runner's default output-length policy ("cap": a request generates max_output_tokens, capped
by the instance's KV capacity).

Why it is an upper bound. Facts about the engine model, for any policy:

F1. An iteration's time is a sum of non-negative terms: `base_s + per_prefill_token_s *
    prefill + per_decode_seq_s * decodes + per_context_token_s * context` (step-time model), or
    `decode_step_s_at(decodes) + prefill / prefill_tokens_per_s` with a table that never falls
    below its first row. Iterations on one instance never overlap; swaps and loads only add.
F2. A request's first token comes from the iteration that computes the last chunk of its
    prompt, all chunks on one instance, each iteration starting no earlier than its dispatch
    (no earlier than its arrival) and no earlier than the instance has its model (at the start
    of the run if it starts with it, else a load of `load_s` begun at the start at the
    earliest). Chunks hold at most `chunk_tokens` tokens, so there are k >= ceil(P / chunk)
    of them; the j-th from last ends with at least P - j * chunk prompt tokens computed, so the
    request's own context terms sum to at least S = sum_j max(P - j * chunk, 0) (plus the
    other members' terms, >= 0). Hence the first token takes at least
    k * base_s + per_prefill_token_s * P + per_context_token_s * S after its start: the
    isolation time (`prefill_lower_bound_s`). A prompt of P + 1 > KV capacity tokens is aborted.
F2'. With a prefix cache (qlm/prefixes/cache.py) a request computes its prompt less the leading
    blocks its engine holds, and an engine holds a block only once a prefill computed it: so
    it computes at least P - H tokens (and at least 1), H the tokens of its leading blocks that
    an earlier request of its model carried (`oracle_hits`: one infinite cache). F2 and the
    prefill work below are priced on those tokens; everything else on the whole prompt.
F3. The attempt that completes a request (an evicted request is submitted again in full)
    generates all its O tokens itself, O = min(max_output_tokens, KV capacity - P) on its
    instance: its first no earlier than the request's first token, then one per iteration
    (a decode step, or the last chunk of a recompute after a preemption), each holding at
    least P + 1 tokens of the request's context. So the request finishes no earlier than its
    first token plus (O - 1) such iterations, O taken on the instance with the least KV room
    (`token_step_lower_bound_s`).
F4. An iteration holds at most `chunk_tokens` tokens (prefill chunks plus one per decode), and
    each costs at least the base time (`base_s`, or the table's first row): so n tokens on one
    instance need at least n / chunk_tokens iterations, and each token may be charged
    base / chunk_tokens of base time without charging any iteration twice.

Isolation bound: a request whose earliest first token (F2, on the best instance) is after its
TTFT deadline, or whose earliest finish (F3) is after its completion deadline or the run's end
(`horizon_s`: unfinished requests miss), misses under every policy.

Capacity bound: by F1 and F4 the request's own terms (and its tokens' shares of the base
time) add up over the iterations it takes part in:
its prefill costs at least `prefill_work_s` of instance time inside [arrival, TTFT deadline]
and its later tokens at least `decode_work_s` inside [arrival, completion deadline]. On M
instances a time window [a, b] offers M (b - a) instance seconds, so the requests that meet
their SLO and whose windows lie inside [a, b] have total work <= M (b - a): at most as many as
the smallest works that fit (`_fit_count`). For windows that do not overlap these limits hold
together, so "feasible requests minus those every chosen window must drop" bounds how many can
meet their SLO; a dynamic program picks the best set of windows from a grid of candidate
endpoints (`_max_on_time`). The same holds for one model's requests on the instances able to
serve it, so the sum over models bounds the count too (`_Capacity`: the least of the two).
Each class's bound counts only its own requests (leaving others out only frees capacity);
the overall bound uses all of them (and is at most the sum of the classes' counts).

What it ignores (so it can be far from reachable): KV memory, batching limits, decode work of
requests without a completion deadline, queueing inside windows that are not on the grid.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from qlm.config import QlmConfig
from qlm.config.engine_config import EngineConfig
from qlm.perf.profile import Profile
from qlm.sim.bound_pricing import (
    prefill_lower_bound_s,
    prefill_work_s,
    token_step_lower_bound_s,
)
from qlm.sim.workload.prefixes import oracle_hits
from qlm.types import Fleet, Request

if TYPE_CHECKING:
    from qlm.sim.scenario import Scenario

Floats = NDArray[np.float64]

# Engine operations within TIME_EPS_S of an iteration boundary act at the boundary, and times
# are floats: the bound gives requests this much slack on every comparison.
SLACK_S = 1e-6
# Candidate window endpoints at most (fewer for long traces: the program is quadratic in it).
MAX_GRID_POINTS = 128
_GRID_WORK = 2e8  # grid points^2 x requests, roughly the element operations allowed


@dataclass(frozen=True)
class AttainmentBound:
    """Upper bounds on the share of requests that meet their SLO (1.0 for no requests)."""

    overall: float
    by_class: Mapping[str, float]
    requests: int
    infeasible: int  # requests that miss even when served alone on the best instance
    capacity_excluded: int  # further requests the capacity windows rule out (overall)

    def __post_init__(self) -> None:
        object.__setattr__(self, "by_class", MappingProxyType(dict(self.by_class)))

    def as_dict(self) -> dict[str, float]:
        """{"overall": ..., <class>: ...}: the shape of summary.json's slo_attainment."""
        return {"overall": self.overall, **self.by_class}


@dataclass(frozen=True, slots=True)
class _Server:
    """Instances of one kind able to serve one model."""

    profile: Profile
    ready_s: float  # earliest time it serves the model (a load from the start if needed)
    kv_capacity_tokens: int


@dataclass(frozen=True)
class RequestLimits:
    """Per request (arrival order of the input): the earliest first token and finish any
    policy can reach, whether the SLO is reachable at all, and the work it must get."""

    first_token_s: Floats
    finish_s: Floats
    feasible: NDArray[np.bool_]
    prefill_work_s: Floats
    decode_work_s: Floats


def request_limits(
    fleet: Fleet,
    requests: Sequence[Request],
    engine: EngineConfig | None = None,
    horizon_s: float = math.inf,
) -> RequestLimits:
    """The isolation limits (F2, F3) and the works of each request."""
    n = len(requests)
    chunk = (engine or EngineConfig()).chunk_tokens
    start_s = min((r.arrival_at_s for r in requests), default=0.0)
    first = np.full(n, math.inf)
    finish = np.full(n, math.inf)
    prefill_work = np.full(n, math.inf)
    decode_work = np.zeros(n)
    for model in sorted({r.model for r in requests}):
        idx = np.asarray([k for k, r in enumerate(requests) if r.model == model], dtype=np.int64)
        chosen = [requests[k] for k in idx]
        prompt = np.asarray([r.prompt_tokens for r in chosen], dtype=np.float64)
        output = np.asarray([r.max_output_tokens for r in chosen], dtype=np.float64)
        arrival = np.asarray([r.arrival_at_s for r in chosen], dtype=np.float64)
        order = np.argsort(arrival, kind="stable")  # the oracle sees requests as they arrive
        hits = np.empty(len(chosen))
        hits[order] = oracle_hits(chosen[k].prefix for k in order.tolist())
        computed = np.maximum(1.0, prompt - hits)  # F2': what no prefix cache can hold
        servers = _servers(fleet, model, start_s)
        limits = _model_limits(servers, prompt, computed, output, arrival, chunk)
        first[idx], finish[idx], prefill_work[idx], decode_work[idx] = limits
    ttft_deadline = np.asarray([r.ttft_deadline_at_s for r in requests], dtype=np.float64)
    end = np.asarray([_finish_by(r, horizon_s) for r in requests], dtype=np.float64)
    feasible = (first <= ttft_deadline + SLACK_S) & (finish <= end + SLACK_S)
    return RequestLimits(first, finish, feasible, prefill_work, decode_work)


def _finish_by(request: Request, horizon_s: float) -> float:
    deadline = request.completion_deadline_at_s
    return horizon_s if deadline is None else min(deadline, horizon_s)


def _servers(fleet: Fleet, model: str, start_s: float) -> list[_Server]:
    """One entry per kind of instance that can serve the model (fleet.can_serve, the engine's
    rule): its profile, when it can first serve it and its KV capacity."""
    kinds: set[_Server] = set()
    for instance in fleet.instances:
        profile = fleet.profile(model, instance)
        if profile is None or not fleet.can_serve(instance, model):
            continue
        loaded = instance.loaded_model == model
        standby = model in instance.standby_models
        ready_s = start_s if loaded else start_s + profile.load_time_s(standby)
        kinds.add(_Server(profile, ready_s, profile.kv_capacity_tokens(instance.gpu_memory_bytes)))
    return sorted(kinds, key=lambda s: (s.profile.gpu_type, s.ready_s, s.kv_capacity_tokens))


def _model_limits(
    servers: Sequence[_Server],
    prompt: Floats,
    computed: Floats,
    output: Floats,
    arrival: Floats,
    chunk: int,
) -> tuple[Floats, Floats, Floats, Floats]:
    """(earliest first token, earliest finish, prefill work, decode work) of one model's
    requests over the instance kinds that serve it, `computed` the prompt tokens they must
    compute at least (F2'); inf where none can take the prompt."""
    inf = np.full(len(prompt), math.inf)
    first, tokens, step_s, prefill_work, token_work = inf, inf, inf, inf, inf
    for server in servers:
        fits = prompt + 1 <= server.kv_capacity_tokens
        start = np.maximum(arrival, server.ready_s)
        here = start + prefill_lower_bound_s(server.profile, computed, chunk)
        first = np.minimum(first, np.where(fits, here, math.inf))
        out = np.minimum(output, server.kv_capacity_tokens - prompt)
        tokens = np.minimum(tokens, np.where(fits, out, math.inf))
        least_s, own_s = token_step_lower_bound_s(server.profile, prompt, chunk)
        step_s = np.minimum(step_s, np.where(fits, least_s, math.inf))
        work = prefill_work_s(server.profile, computed, chunk)
        prefill_work = np.minimum(prefill_work, np.where(fits, work, math.inf))
        token_work = np.minimum(token_work, np.where(fits, own_s, math.inf))
    later = np.where(np.isfinite(tokens), tokens - 1, 0.0)
    finish = first + later * np.where(np.isfinite(step_s), step_s, 0.0)
    decode_work = later * np.where(np.isfinite(token_work), token_work, 0.0)
    return first, finish, prefill_work, decode_work


def attainment_bound(
    fleet: Fleet,
    requests: Sequence[Request],
    config: QlmConfig,
    *,
    engine: EngineConfig | None = None,
    horizon_s: float = math.inf,
) -> AttainmentBound:
    """Upper bounds on SLO attainment, overall and per class (module docstring)."""
    n = len(requests)
    limits = request_limits(fleet, requests, engine, horizon_s)
    capacity = _Capacity.of(fleet, requests, _Windows.of(requests, limits, horizon_s))
    classes = [c.name for c in config.slo_classes]
    classes += sorted({r.slo_class for r in requests} - set(classes))
    counts: dict[str, int] = {}
    by_class: dict[str, float] = {}
    for name in classes:
        members = np.asarray([r.slo_class == name for r in requests], dtype=np.bool_)
        if members.any():
            counts[name] = capacity.max_on_time(members & limits.feasible)
            by_class[name] = counts[name] / int(members.sum())
    feasible = int(limits.feasible.sum())
    overall = min(capacity.max_on_time(limits.feasible), sum(counts.values()))
    return AttainmentBound(
        overall=overall / n if n else 1.0,
        by_class=by_class,
        requests=n,
        infeasible=n - feasible,
        capacity_excluded=feasible - overall,
    )


@dataclass(frozen=True)
class _Capacity:
    """The capacity bound over the whole fleet, and per model over the instances able to
    serve it (a model's requests can use no other): the least of the two counts holds."""

    windows: _Windows
    model_of: NDArray[np.str_]
    machines: int
    machines_by_model: Mapping[str, int]

    @classmethod
    def of(cls, fleet: Fleet, requests: Sequence[Request], windows: _Windows) -> _Capacity:
        models = sorted({r.model for r in requests})
        by_model = {m: sum(fleet.can_serve(i, m) for i in fleet.instances) for m in models}
        machines = sum(any(fleet.can_serve(i, m) for m in models) for i in fleet.instances)
        model_of = np.asarray([r.model for r in requests], dtype=np.str_)
        return cls(windows, model_of, machines, by_model)

    def max_on_time(self, chosen: NDArray[np.bool_]) -> int:
        pooled = _max_on_time(self.windows.subset(chosen), self.machines)
        if len(self.machines_by_model) < 2:
            return pooled
        split = sum(
            _max_on_time(self.windows.subset(chosen & (self.model_of == m)), count)
            for m, count in self.machines_by_model.items()
        )
        return min(pooled, split)


def scenario_bound(scenario: Scenario, seed: int) -> AttainmentBound:
    """The bound for a scenario's requests at this seed, on its fleet, up to its horizon (the
    runner's default engines: qlm/sim/simulate.py)."""
    return attainment_bound(
        scenario.fleet(),
        scenario.requests(seed),
        scenario.config,
        engine=scenario.engine,
        horizon_s=scenario.horizon_s or math.inf,
    )


@dataclass(frozen=True)
class _Windows:
    """Each request's work and the windows it must get it in (capacity bound)."""

    release_s: Floats
    prefill_end_s: Floats
    prefill_work_s: Floats
    decode_end_s: Floats  # inf: no deadline, so its decode work constrains no window
    decode_work_s: Floats

    @classmethod
    def of(cls, requests: Sequence[Request], limits: RequestLimits, horizon_s: float) -> _Windows:
        def column(values: Sequence[float]) -> Floats:
            return np.asarray(values, dtype=np.float64)

        return cls(
            column([r.arrival_at_s for r in requests]),
            column([r.ttft_deadline_at_s for r in requests]),
            limits.prefill_work_s,
            column([_finish_by(r, horizon_s) for r in requests]),
            limits.decode_work_s,
        )

    def subset(self, chosen: NDArray[np.bool_]) -> _Windows:
        return _Windows(
            self.release_s[chosen],
            self.prefill_end_s[chosen],
            self.prefill_work_s[chosen],
            self.decode_end_s[chosen],
            self.decode_work_s[chosen],
        )

    def grid(self) -> Floats:
        """Candidate window endpoints: every release and deadline, or quantiles of them."""
        finite = self.decode_end_s[np.isfinite(self.decode_end_s)]
        times = np.unique(np.concatenate([self.release_s, self.prefill_end_s, finite]))
        n = len(self.release_s)
        points = max(16, min(MAX_GRID_POINTS, math.isqrt(int(_GRID_WORK // max(1, n)))))
        if len(times) <= points:
            return times
        return np.unique(np.quantile(times, np.linspace(0.0, 1.0, points)))

    def sizes_within(self, a_s: float, b_s: float) -> Floats:
        """The work of each request whose windows lie inside [a_s, b_s]."""
        inside = self.release_s >= a_s - SLACK_S
        prefill = inside & (self.prefill_end_s <= b_s + SLACK_S)
        decode = prefill & (self.decode_end_s <= b_s + SLACK_S)
        work = self.prefill_work_s + np.where(decode, self.decode_work_s, 0.0)
        return work[prefill]


def _max_on_time(windows: _Windows, machines: int) -> int:
    """An upper bound on how many of these requests can get their work in their windows on
    `machines` instances: the count minus the drops of the best set of disjoint windows."""
    n = len(windows.release_s)
    if n == 0 or machines == 0:
        return 0 if machines == 0 else n
    grid = windows.grid()
    best = np.zeros(len(grid))  # best[k]: most drops by windows inside [grid[0], grid[k]]
    for k in range(1, len(grid)):
        best[k] = best[k - 1]
        for j in range(k):
            sizes = windows.sizes_within(grid[j], grid[k])
            if len(sizes):
                capacity_s = machines * (grid[k] - grid[j] + 3 * SLACK_S)
                drop = len(sizes) - _fit_count(sizes, capacity_s)
                best[k] = max(best[k], best[j] + drop)
    return n - int(best[-1])


def _fit_count(sizes: Floats, capacity_s: float) -> int:
    """The most of these works that fit in capacity_s together: the smallest ones first."""
    total = np.cumsum(np.sort(sizes)) * (1.0 - 1e-9)  # float sums never tip a count down
    return int(np.searchsorted(total, capacity_s, side="right"))
