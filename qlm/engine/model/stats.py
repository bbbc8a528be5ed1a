"""What an engine model has done since it was built: iterations, tokens, preemptions, time.

Question answered: how much work did the engine do? `EngineCounters` is the mutable tally the
engine's parts add to; `EngineStats` is the frozen snapshot that `EngineModel.stats` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from qlm.prefixes.cache import PrefixCounters


@dataclass(frozen=True, slots=True)
class EngineStats:
    """Counters since the engine was built."""

    iterations: int
    prefill_tokens: int
    decode_tokens: int
    preemptions_recompute: int
    preemptions_swap: int
    swapped_tokens: int  # KV tokens moved between GPU and CPU, both ways
    busy_s: float  # time spent in completed iterations
    finished: int
    aborted: int
    segments: int  # runs of iterations the model computed in one go (<= iterations)
    # The prefix cache (qlm/prefixes/cache.py): prompt tokens admitted with a prefix, those of them
    # found cached (not computed), and cached tokens evicted for room.
    prefix_prompt_tokens: int = 0
    prefix_hit_tokens: int = 0
    prefix_evicted_tokens: int = 0
    handed_off: int = 0  # requests a prefill engine passed to a decode engine
    received: int = 0  # handed-off requests a decode engine admitted with their KV

    @property
    def prefix_hit_ratio(self) -> float:
        """Share of prefixed prompt tokens served from the cache (0.0 when none)."""
        prompt_tokens = self.prefix_prompt_tokens
        return self.prefix_hit_tokens / prompt_tokens if prompt_tokens else 0.0

    @property
    def preemptions(self) -> int:
        return self.preemptions_recompute + self.preemptions_swap


@dataclass(slots=True)
class EngineCounters:
    """The running tally behind EngineStats (one per engine, kept across model loads)."""

    iterations: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    preemptions_recompute: int = 0
    preemptions_swap: int = 0
    swapped_tokens: int = 0
    busy_s: float = 0.0
    finished: int = 0
    aborted: int = 0
    segments: int = 0
    handed_off: int = 0
    received: int = 0
    prefix: PrefixCounters = field(default_factory=PrefixCounters)

    def snapshot(self) -> EngineStats:
        return EngineStats(
            iterations=self.iterations,
            prefill_tokens=self.prefill_tokens,
            decode_tokens=self.decode_tokens,
            preemptions_recompute=self.preemptions_recompute,
            preemptions_swap=self.preemptions_swap,
            swapped_tokens=self.swapped_tokens,
            busy_s=self.busy_s,
            finished=self.finished,
            aborted=self.aborted,
            segments=self.segments,
            prefix_prompt_tokens=self.prefix.prompt_tokens,
            prefix_hit_tokens=self.prefix.hit_tokens,
            prefix_evicted_tokens=self.prefix.evicted_tokens,
            handed_off=self.handed_off,
            received=self.received,
        )
