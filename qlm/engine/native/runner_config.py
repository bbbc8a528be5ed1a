"""RunnerConfig: what one native runner may hold and compute per step (blocks, sequences,
tokens) and how it orders its work; built from the fleet file's `engine.native`
(qlm/config/native_config.py). No torch: the configuration is read where no engine runs."""

from __future__ import annotations

from dataclasses import dataclass

from qlm.config.native_config import NativeEngineConfig


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    block_size: int = 16
    num_blocks: int = 1024
    max_num_seqs: int = 64
    max_batched_tokens: int = 2048  # tokens one step computes (prefill chunks + decodes)
    # Sequences of a step whose tables start with the same full blocks (forks of one parent)
    # read that prefix's K and V once (attention.py); False: each reads its whole context.
    shared_prefix: bool = True
    # Full blocks stay cached (by a digest of their tokens and all before them) after their
    # sequences end, and a new sequence starting with the same tokens takes them back.
    prefix_caching: bool = True
    policy: str = "fcfs"  # local scheduling (local_policy.py): fcfs, srpt-mlfq, prefix-groups
    max_wait_steps: int = 64  # srpt-mlfq: a sequence waiting this many steps goes first
    mlfq_quantum_tokens: int = 16  # srpt-mlfq: output tokens of the first feedback level
    prefix_groups: int = 10  # prefix-groups: priority groups by cache-hit share (Preble's P)

    def __post_init__(self) -> None:
        if min(self.block_size, self.num_blocks, self.max_num_seqs) < 1:
            raise ValueError("block_size, num_blocks and max_num_seqs must be >= 1")
        if self.max_batched_tokens < self.max_num_seqs:
            raise ValueError("max_batched_tokens must be >= max_num_seqs (one decode each)")

    @classmethod
    def of(cls, config: NativeEngineConfig, num_blocks: int) -> RunnerConfig:
        """The runner's settings for a cache of `num_blocks` blocks, from the fleet file's
        `engine.native`."""
        return cls(
            block_size=config.block_size,
            num_blocks=num_blocks,
            max_num_seqs=config.max_num_seqs,
            max_batched_tokens=max(config.max_batched_tokens, config.max_num_seqs),
            shared_prefix=config.shared_prefix,
            prefix_caching=config.prefix_caching,
            policy=config.policy,
            max_wait_steps=config.max_wait_steps,
            prefix_groups=config.prefix_groups,
        )
