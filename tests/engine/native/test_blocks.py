"""Paged KV blocks (qlm/engine/native/blocks.py): reference counts, forks and copy-on-write,
and running out of blocks without changing anything."""

from __future__ import annotations

import pytest
import torch

from qlm.engine.native.blocks import BlockPool, BlockTable, KvCache, OutOfBlocksError
from tests.engine.native.helpers import SHAPE


def test_blocks_are_counted_and_freed_when_no_holder_is_left() -> None:
    pool, cache = BlockPool(4, 4), KvCache(SHAPE, 4, 4)
    parent = BlockTable()
    pool.grow(parent, 6, cache)
    parent.num_tokens = 6
    assert (len(parent.blocks), pool.free_blocks) == (2, 2)
    child = pool.fork(parent)
    assert [pool.refs(b) for b in parent.blocks] == [2, 2]
    pool.free(parent)
    assert pool.free_blocks == 2  # the child still holds both
    pool.free(child)
    assert pool.free_blocks == 4


def test_writing_into_a_shared_partial_block_copies_it_first() -> None:
    pool, cache = BlockPool(4, 4), KvCache(SHAPE, 4, 4)
    parent = BlockTable()
    pool.grow(parent, 6, cache)
    parent.num_tokens = 6
    cache.k[:, pool.slots(parent, 0, 6)] = 7.0
    child = pool.fork(parent)
    assert pool.extra_blocks(child, 1) == 1  # the copy
    pool.grow(child, 1, cache)
    assert child.blocks[0] == parent.blocks[0]
    assert child.blocks[1] != parent.blocks[1]
    assert torch.equal(cache.k[:, pool.slots(child, 0, 6)], cache.k[:, pool.slots(parent, 0, 6)])
    assert pool.refs(parent.blocks[1]) == 1


def test_a_full_shared_block_is_not_copied() -> None:
    pool, cache = BlockPool(4, 4), KvCache(SHAPE, 4, 4)
    parent = BlockTable()
    pool.grow(parent, 4, cache)
    parent.num_tokens = 4
    child = pool.fork(parent)
    pool.grow(child, 1, cache)
    assert child.blocks[0] == parent.blocks[0]
    assert len(child.blocks) == 2


def test_running_out_of_blocks_changes_nothing() -> None:
    pool, cache = BlockPool(2, 4), KvCache(SHAPE, 2, 4)
    table = BlockTable()
    pool.grow(table, 5, cache)
    table.num_tokens = 5
    with pytest.raises(OutOfBlocksError):
        pool.grow(table, 4, cache)  # 5 + 4 tokens need 3 blocks
    assert (len(table.blocks), pool.free_blocks) == (2, 0)


def test_slots_follow_the_block_table() -> None:
    pool = BlockPool(8, 4)
    table = BlockTable([5, 2], 0)
    assert pool.slots(table, 2, 4).tolist() == [22, 23, 8, 9]
