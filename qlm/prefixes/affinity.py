"""Prefix locality for one instance's dispatch queue: which queued requests are its own, which
another instance's, and how long to leave another's request to it.

Preble's exploit rule decides where a request belongs: when some instance holds more of its
prompt than the request would compute there (cached part > missed part), it belongs to the
instance holding the most (unless every instance on the model holds as much: then it costs
the same anywhere and belongs nowhere in particular); otherwise (explore) nowhere in
particular. Dispatch then serves an instance's own requests first, the rest next and
another's last (`by_affinity`), except that the earliest-due request goes first whenever
locality would make it late.

Last is not enough when this instance has a free slot and the owner is busy or slow to
wake: the request would land here at once and pay its whole prefill again. Whether to wait
for the owner or take it is a rent-or-buy choice (the ski-rental problem): taking it costs
the extra prefill here (`extra_s`, the prompt this instance lacks against what the owner
lacks, at this instance's prefill speed); waiting costs the time waited. This instance
leaves the request to its owner for at most `extra_s` from when it first could have taken
it (never past the latest start that still meets the request's TTFT deadline here), then
takes it: the cost is never more than twice the better of the two choices made knowing
when the owner frees. (A request that can no longer meet its deadline here is held the
whole time: only its owner, which computes less, might still meet it.) Held back, a
request is not in this instance's queue at all (`HOLD`); `wake_at_s` says when the earliest
hold ends, so that a caller with no other reason to look again (an idle instance) does.

Pure; the live agents and the simulator's `qlm` policy use it alike (each with its own view
of who holds what: the plan's `prefix_held` live, the router's `PrefixIndex` simulated).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Collection, Mapping, MutableMapping, Sequence
from typing import Generic, Protocol, TypeVar

from qlm.prefixes.index import leading_tokens
from qlm.types import PrefixBlock


class Queued(Protocol):
    """What affinity reads of a queued item (qlm.agents.queued.QueuedItem fits it)."""

    @property
    def request_id(self) -> str: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def ttft_deadline_at_s(self) -> float: ...


OWN = 1  # this instance holds the most of the prompt, and that outweighs the rest
ANY = 0  # nobody holds enough of it to matter
THEIRS = -1  # another instance holds more: served here after everything else
HOLD = -2  # another's, and still worth waiting for: not served here now


def owner_side(
    instance_id: str,
    held: Mapping[str, int],
    prompt_tokens: int,
    pool: Collection[str] | None = None,
) -> int:
    """OWN, ANY or THEIRS by Preble's exploit rule, from the prompt tokens each instance of
    the pool holds (`held`; instances missing hold none). With the `pool` (the instances on
    the model), a request every one of them holds as much of is ANY, not OWN: it costs the
    same wherever it goes, so no instance should put it before others (a hot prefix every
    instance holds would otherwise go first everywhere, ahead of requests nobody owns)."""
    most = max(held.values(), default=0)
    if most <= 0 or most <= prompt_tokens - most:
        return ANY
    if held.get(instance_id, 0) < most:
        return THEIRS
    if pool is not None and all(held.get(i, 0) >= most for i in pool):
        return ANY
    return OWN


Q = TypeVar("Q", bound=Queued)


class PrefixAffinity(Generic[Q]):
    """The side of each queued request for `instance_id` at `now_s`, with the rent-or-buy
    hold (module docstring). `deferred` (request id -> when this instance first held it
    back) is the caller's, kept between rounds; `prune` keeps only the requests seen since
    the last prune."""

    def __init__(
        self,
        instance_id: str,
        held_of: Callable[[Q], Mapping[str, int] | None],
        prefill_s: Callable[[int], float],
        deferred: MutableMapping[str, float],
        now_s: float,
        pool: Collection[str] | None = None,
    ) -> None:
        self.instance_id = instance_id
        self.pool = pool  # the instances on the model (owner_side); None: not known
        self._held_of = held_of
        self._prefill_s = prefill_s
        self._deferred = deferred
        self._seen: set[str] = set()
        self.now_s = now_s
        self.wake_at_s = math.inf  # when the earliest hold seen so far ends

    def __call__(self, item: Q) -> int:
        held = self._held_of(item)
        if not held:
            return ANY
        side = owner_side(self.instance_id, held, item.prompt_tokens, self.pool)
        if side != THEIRS:
            return side
        until_s = self._hold_until_s(item, held)
        if self.now_s >= until_s:
            return THEIRS
        self.wake_at_s = min(self.wake_at_s, until_s)
        return HOLD

    def _hold_until_s(self, item: Q, held: Mapping[str, int]) -> float:
        prompt = item.prompt_tokens
        missed_here = prompt - held.get(self.instance_id, 0)
        missed_there = prompt - max(held.values())
        extra_s = self._prefill_s(missed_here) - self._prefill_s(missed_there)
        first_s = self._deferred.setdefault(item.request_id, self.now_s)
        self._seen.add(item.request_id)
        until_s = first_s + max(0.0, extra_s)
        latest_start_s = item.ttft_deadline_at_s - self._prefill_s(missed_here)
        if latest_start_s >= self.now_s:  # here it can still meet its deadline: not past then
            until_s = min(until_s, latest_start_s)
        return until_s

    def prune(self) -> None:
        """Forget holds of requests not seen in this round (pulled, or no longer another's)."""
        for request_id in [r for r in self._deferred if r not in self._seen]:
            del self._deferred[request_id]


NOT_BROKEN = -1  # HeldByReports: every block through this one is held


def held_by_reports(
    reported: Mapping[str, frozenset[int]], prefix: Sequence[PrefixBlock]
) -> dict[str, int]:
    """Per instance that reports holding the prompt's first block, the tokens of the
    prompt's leading blocks it holds (`reported`: each instance's prefix keys)."""
    held = {instance_id: leading_tokens(keys, prefix) for instance_id, keys in reported.items()}
    return {instance_id: tokens for instance_id, tokens in held.items() if tokens}


class HeldByReports:
    """`held_by_reports` for many prompts at once, remembering per instance and block key
    how far from the start the instance holds the prompt (keys are chained: a block key
    names the text from the start through it). Prompts that share blocks, a batch job's
    thousands, are walked back only over what they do not share."""

    def __init__(self, reported: Mapping[str, frozenset[int]]) -> None:
        self.reported = reported
        # instance -> block key -> the first block not held (< its depth), or NOT_BROKEN
        self._broken_at: dict[str, dict[int, int]] = {i: {} for i in reported}

    def held(self, prefix: Sequence[PrefixBlock]) -> dict[str, int]:
        held = {}
        through: list[int] | None = None  # tokens from the start through each block
        for instance_id, keys in self.reported.items():
            depth = self._first_missing(self._broken_at[instance_id], keys, prefix)
            if depth:
                through = through or list(itertools.accumulate(b.tokens for b in prefix))
                held[instance_id] = through[depth - 1]
        return held

    @staticmethod
    def _first_missing(
        memo: dict[int, int], keys: frozenset[int], prefix: Sequence[PrefixBlock]
    ) -> int:
        """The depth of the prompt's first block the instance does not hold (len: none)."""
        start = 0
        for depth in range(len(prefix) - 1, -1, -1):  # the deepest block seen before
            broken_at = memo.get(prefix[depth].key)
            if broken_at is not None:
                if broken_at != NOT_BROKEN:
                    return broken_at
                start = depth + 1
                break
        for depth in range(start, len(prefix)):
            if prefix[depth].key not in keys:
                for block in prefix[depth:]:  # prompts sharing these blocks stop here too
                    memo[block.key] = depth
                return depth
            memo[prefix[depth].key] = NOT_BROKEN
        return len(prefix)
