"""Paged KV memory: fixed-size blocks of token slots, shared by reference count.

Question answered: where does each sequence's K and V live, and how do sequences share a
prefix? Every layer's cache is one tensor of `num_blocks` blocks of `block_size` token slots
(`KvCache`). A sequence owns a `BlockTable` (its blocks in order). `BlockPool.fork` gives a
child the parent's blocks (each one's count goes up: no copy); the first write into a block
that others still hold copies it first (`writable`: copy-on-write), so shared full blocks are
never copied. Freeing drops counts; a block with none left returns to the free list, or,
when it is full and its contents are known (`remember`: a digest of its tokens and all
before them), waits in the prefix cache, where a sequence starting with the same tokens takes
it back (`lookup`) instead of computing them again; allocations reuse the least recently
released cached block when no free one is left.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from qlm.engine.native.checkpoint import LlamaShape


class OutOfBlocksError(RuntimeError):
    """No free block: the scheduler preempts a sequence and retries."""


@dataclass(slots=True)
class BlockTable:
    """One sequence's blocks and how many token slots of them hold K and V."""

    blocks: list[int] = field(default_factory=list)
    num_tokens: int = 0


class BlockPool:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() gives block 0 first
        self._refs = [0] * num_blocks
        # The prefix cache: full blocks by the digest of their tokens and every token before
        # them; those nobody holds wait in `_idle` (least recently released first) until a
        # sequence with the same prefix takes them back or an allocation reuses them.
        self._key_of: dict[int, bytes] = {}
        self._by_key: dict[bytes, int] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()

    @property
    def free_blocks(self) -> int:
        """Blocks an allocation can take: free ones and cached ones nobody holds."""
        return len(self._free) + len(self._idle)

    @property
    def cached_blocks(self) -> int:
        return len(self._key_of)

    def remember(self, block: int, key: bytes) -> None:
        """Block `block` is full and its contents are those `key` names."""
        if key not in self._by_key and block not in self._key_of:
            self._by_key[key] = block
            self._key_of[block] = key

    def cached(self, key: bytes) -> bool:
        """Whether a block with contents `key` is cached (nothing held)."""
        return key in self._by_key

    def lookup(self, key: bytes) -> int | None:
        """The cached block with contents `key`, now held once more (None: not cached)."""
        block = self._by_key.get(key)
        if block is None:
            return None
        if self._refs[block] == 0:
            del self._idle[block]
        self._refs[block] += 1
        return block

    def refs(self, block: int) -> int:
        return self._refs[block]

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self) -> int:
        if self._free:
            block = self._free.pop()
        elif self._idle:
            block, _ = self._idle.popitem(last=False)  # the least recently released
            del self._by_key[self._key_of.pop(block)]
        else:
            raise OutOfBlocksError(f"all {self.num_blocks} KV blocks are in use")
        self._refs[block] = 1
        return block

    def release(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block] == 0:
            if block in self._key_of:
                self._idle[block] = None
            else:
                self._free.append(block)

    def free(self, table: BlockTable) -> None:
        """Release the table's blocks, its tail first: the prefix cache then reuses a
        sequence's last blocks before its first ones, which other prompts share more often."""
        for block in reversed(table.blocks):
            self.release(block)
        table.blocks.clear()
        table.num_tokens = 0

    def fork(self, table: BlockTable) -> BlockTable:
        """A child sharing all of `table`'s blocks (no copy)."""
        for block in table.blocks:
            self._refs[block] += 1
        return BlockTable(list(table.blocks), table.num_tokens)

    def extra_blocks(self, table: BlockTable, new_tokens: int) -> int:
        """Blocks `table` needs to take `new_tokens` more (a shared last block counts: it is
        copied before the write)."""
        total = self.blocks_for(table.num_tokens + new_tokens) - len(table.blocks)
        shared_tail = table.num_tokens % self.block_size and self._refs[table.blocks[-1]] > 1
        return total + (1 if shared_tail and new_tokens else 0)

    def grow(self, table: BlockTable, new_tokens: int, cache: KvCache) -> None:
        """Make room in `table` for `new_tokens` more slots (OutOfBlocksError, changing nothing,
        when the pool lacks them)."""
        if self.extra_blocks(table, new_tokens) > self.free_blocks:
            raise OutOfBlocksError(f"{new_tokens} tokens need more than {self.free_blocks} blocks")
        if new_tokens and table.num_tokens % self.block_size:
            last = table.blocks[-1]
            if self._refs[last] > 1:  # copy-on-write of the partly filled last block
                copy = self.allocate()
                cache.copy_block(last, copy)
                self.release(last)
                table.blocks[-1] = copy
        while len(table.blocks) < self.blocks_for(table.num_tokens + new_tokens):
            table.blocks.append(self.allocate())

    def slots(self, table: BlockTable, start: int, count: int) -> torch.Tensor:
        """Flat slot indexes (block * block_size + offset) of token positions
        [start, start + count) of `table`."""
        positions = torch.arange(start, start + count)
        blocks = torch.tensor(table.blocks, dtype=torch.long)[positions // self.block_size]
        return blocks * self.block_size + positions % self.block_size


class KvCache:
    """Every layer's K and V: [num_blocks * block_size, num_kv_heads, head_dim] each."""

    def __init__(self, shape: LlamaShape, num_blocks: int, block_size: int) -> None:
        slots = num_blocks * block_size
        size = (shape.num_layers, slots, shape.num_kv_heads, shape.head_dim)
        self.block_size = block_size
        self.k = torch.zeros(size)
        self.v = torch.zeros(size)

    def copy_block(self, source: int, target: int) -> None:
        src = slice(source * self.block_size, (source + 1) * self.block_size)
        dst = slice(target * self.block_size, (target + 1) * self.block_size)
        self.k[:, dst] = self.k[:, src]
        self.v[:, dst] = self.v[:, src]

    @staticmethod
    def blocks_fitting(shape: LlamaShape, budget_bytes: int, block_size: int) -> int:
        return max(1, budget_bytes // (shape.kv_bytes_per_token * block_size))
