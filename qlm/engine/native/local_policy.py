"""Local scheduling inside one engine: who is admitted, who runs first, who is preempted.

Question answered: in which order does the engine serve the sequences it holds? A
`LocalPolicy` orders the prompts (running ones still in prefill and waiting ones) for the
step's token budget, the running sequences for their decodes, and names the victim when KV
blocks run out. Chosen by name (`LOCAL_POLICIES`):

* `fcfs`: running prompts first, then admission in arrival order; running sequences in
  admission order; the one admitted last is preempted (vLLM's behaviour).
* `srpt-mlfq` (after Prophet): prompt chunks by the shortest remaining prompt first, running
  or waiting (SRPT: a long prompt no longer blocks the short ones queued behind it), except
  that a sequence `max_wait_steps` steps or more past its arrival goes first (the starvation
  bound: served within that many steps of becoming the oldest, room permitting); running
  sequences by a multi-level feedback queue on tokens generated (level =
  floor(log2(1 + output / quantum)): new and short outputs first when the budget is short),
  and the victim is the one at the highest level (the most served), the latest admitted
  among those.
* `prefix-groups` (Preble): running prompts first, then waiting sequences in priority
  groups by the share of their prompt the prefix cache holds now, each group admitted in
  proportion to its priority (qlm/prefixes/local_order.py, shared with the engine model):
  sequences that would compute little go first, yet those that hit nothing keep a share of
  every round of one step. Rounds restart every step, so while hits keep coming the top
  group would always be first: a sequence waiting `max_wait_steps` or more goes first (oldest
  first), as in srpt-mlfq. Running order and victim as `fcfs`.

Steps are the clock: the runner is clock-free, so waits and bounds count engine steps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from qlm.engine.native.paged_sequence import Seq
from qlm.prefixes.local_order import by_priority_groups

CachedTokens = Callable[[Seq], int]  # leading tokens of a sequence the prefix cache holds


class LocalPolicy(Protocol):
    def prefill_order(self, running: Sequence[Seq], waiting: Iterable[Seq], step: int) -> list[Seq]:
        """The order in which prompts get the step's budget left after the decodes: running
        sequences still in prefill and waiting ones (admitted in that order)."""
        ...

    def running_order(self, running: Sequence[Seq]) -> list[Seq]: ...

    def victim(self, running: Sequence[Seq]) -> Seq: ...


@dataclass(frozen=True, slots=True)
class Fcfs:
    def prefill_order(self, running: Sequence[Seq], waiting: Iterable[Seq], step: int) -> list[Seq]:
        return [*running, *waiting]

    def running_order(self, running: Sequence[Seq]) -> list[Seq]:
        return list(running)

    def victim(self, running: Sequence[Seq]) -> Seq:
        return running[-1]


@dataclass(frozen=True, slots=True)
class SrptMlfq:
    max_wait_steps: int = 64
    quantum_tokens: int = 16

    def prefill_order(self, running: Sequence[Seq], waiting: Iterable[Seq], step: int) -> list[Seq]:
        """Starving sequences (oldest first), then the shortest remaining prompt first,
        running or waiting alike."""
        ordered = sorted([*running, *waiting], key=lambda s: (s.queued_step, s.seq_id))
        starving = [s for s in ordered if step - s.queued_step >= self.max_wait_steps]
        rest = [s for s in ordered if step - s.queued_step < self.max_wait_steps]
        return starving + sorted(rest, key=lambda s: s.pending)  # stable: ties by arrival

    def level(self, seq: Seq) -> int:
        return int(math.log2(1 + len(seq.output) / self.quantum_tokens))

    def running_order(self, running: Sequence[Seq]) -> list[Seq]:
        return sorted(running, key=self.level)  # stable: ties in admission order

    def victim(self, running: Sequence[Seq]) -> Seq:
        top = max(self.level(s) for s in running)
        return [s for s in running if self.level(s) == top][-1]


@dataclass(frozen=True, slots=True)
class PrefixGroups(Fcfs):
    cached_tokens: CachedTokens = lambda _seq: 0
    groups: int = 10
    max_wait_steps: int = 64

    def prefill_order(self, running: Sequence[Seq], waiting: Iterable[Seq], step: int) -> list[Seq]:
        def hits(seq: Seq) -> tuple[int, int]:
            return self.cached_tokens(seq), seq.length

        seqs = list(waiting)
        starving = [s for s in seqs if step - s.queued_step >= self.max_wait_steps]
        rest = [s for s in seqs if step - s.queued_step < self.max_wait_steps]
        starving.sort(key=lambda s: s.queued_step)  # stable: ties in queue order
        return [*running, *starving, *by_priority_groups(rest, hits, self.groups)]


@dataclass(frozen=True, slots=True)
class LocalPolicyConfig:
    """What the policies are made from (each takes what it needs)."""

    max_wait_steps: int = 64
    quantum_tokens: int = 16
    prefix_groups: int = 10
    cached_tokens: CachedTokens = lambda _seq: 0


LOCAL_POLICIES: dict[str, Callable[[LocalPolicyConfig], LocalPolicy]] = {
    "fcfs": lambda _c: Fcfs(),
    "srpt-mlfq": lambda c: SrptMlfq(c.max_wait_steps, c.quantum_tokens),
    "prefix-groups": lambda c: PrefixGroups(c.cached_tokens, c.prefix_groups, c.max_wait_steps),
}


def local_policy(name: str, config: LocalPolicyConfig) -> LocalPolicy:
    """The policy named `name`; ValueError listing the known names otherwise."""
    make = LOCAL_POLICIES.get(name)
    if make is None:
        raise ValueError(f"unknown local policy {name!r}; known: {', '.join(LOCAL_POLICIES)}")
    return make(config)
