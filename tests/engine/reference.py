"""A deliberately naive reference engine for tests: one Python step per iteration, plain lists,
recompute preemption only. It follows the scheduling rules stated in
qlm/engine/model/scheduler.py and shares none of EngineModel's bookkeeping (no decode counter,
no heap, no fast-forward), so agreement between the two checks the fast path against the
rules."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from qlm.perf.profile import Profile
from qlm.perf.step import TIME_EPS_S


@dataclass
class RefRequest:
    id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int  # tokens it generates (already capped by the caller's rules)


@dataclass
class _RefSeq:
    req: RefRequest
    target: int
    out: int = 0
    computed: int = 0
    prefill_target: int = 0
    decoding: bool = False


@dataclass
class RefResult:
    first_token_s: dict[str, float] = field(default_factory=dict)
    finish_s: dict[str, float] = field(default_factory=dict)
    output_tokens: dict[str, int] = field(default_factory=dict)
    aborted: set[str] = field(default_factory=set)
    preemptions: int = 0
    iterations: int = 0


def run_reference(
    profile: Profile,
    capacity_tokens: int,
    max_num_seqs: int,
    chunk_tokens: int,
    requests: list[RefRequest],
) -> RefResult:
    """Serve requests (sorted by arrival) to completion; return per-request times."""
    result = RefResult()
    arrivals = deque(sorted(requests, key=lambda r: r.arrival_s))
    waiting: deque[_RefSeq] = deque()
    running: list[_RefSeq] = []
    t = 0.0
    while True:
        while arrivals and arrivals[0].arrival_s <= t + TIME_EPS_S:
            req = arrivals.popleft()
            if req.prompt_tokens + 1 > capacity_tokens:
                result.aborted.add(req.id)
                continue
            target = max(1, min(req.output_tokens, capacity_tokens - req.prompt_tokens))
            waiting.append(_RefSeq(req, target))
        step = _plan(capacity_tokens, max_num_seqs, chunk_tokens, waiting, running, result)
        if step is None:
            if not arrivals:
                return result
            t = max(t, arrivals[0].arrival_s)
            continue
        decodes, chunks = step
        prefill = sum(c for _, c in chunks)
        context = sum(s.req.prompt_tokens + s.out for s in decodes)
        context += sum(s.computed + c for s, c in chunks)
        t += profile.iteration_s(prefill, len(decodes), context)
        result.iterations += 1
        _apply(t, decodes, chunks, running, result)


def _plan(
    capacity: int,
    max_num_seqs: int,
    chunk_tokens: int,
    waiting: deque[_RefSeq],
    running: list[_RefSeq],
    result: RefResult,
) -> tuple[list[_RefSeq], list[tuple[_RefSeq, int]]] | None:
    def used() -> int:
        return sum(
            s.req.prompt_tokens + s.out if s.decoding else s.prefill_target + 1 for s in running
        )

    def decoding() -> list[_RefSeq]:
        return [s for s in running if s.decoding]

    preempted = False
    while len(decoding()) > capacity - used():
        victim = running.pop()
        victim.decoding = False
        victim.computed = 0
        waiting.appendleft(victim)
        result.preemptions += 1
        preempted = True
    decodes = decoding()
    tokens = chunk_tokens - len(decodes)
    chunks: list[tuple[_RefSeq, int]] = []
    for s in running:
        if not s.decoding and tokens > 0:
            c = min(s.prefill_target - s.computed, tokens)
            chunks.append((s, c))
            tokens -= c
    slots = max_num_seqs - len(running)
    while not preempted and waiting and slots > 0 and tokens > 0:
        s = waiting[0]
        need = s.req.prompt_tokens + s.out + 1
        if need > capacity - used() - len(decodes):
            break
        waiting.popleft()
        s.prefill_target = s.req.prompt_tokens + s.out
        s.computed = 0
        running.append(s)
        slots -= 1
        c = min(s.prefill_target, tokens)
        chunks.append((s, c))
        tokens -= c
    if not decodes and not chunks:
        return None
    return decodes, chunks


def _apply(
    t: float,
    decodes: list[_RefSeq],
    chunks: list[tuple[_RefSeq, int]],
    running: list[_RefSeq],
    result: RefResult,
) -> None:
    for s in decodes:
        s.out += 1
        if s.out >= s.target:
            _finish(s, t, running, result)
    for s, c in chunks:
        s.computed += c
        if s.computed < s.prefill_target:
            continue
        s.out += 1
        result.first_token_s.setdefault(s.req.id, t)
        if s.out >= s.target:
            _finish(s, t, running, result)
        else:
            s.decoding = True


def _finish(s: _RefSeq, t: float, running: list[_RefSeq], result: RefResult) -> None:
    running.remove(s)
    result.finish_s[s.req.id] = t
    result.output_tokens[s.req.id] = s.out
