"""Shared-prefix decode attention as a Triton kernel, for GPUs (the torch path in attention.py
serves the CPU).

Question answered: how does a GPU read a shared prefix once for a batch? One kernel,
`_attend_slots`, computes attention with its log-sum-exp for a block of query rows over a
list of cache slots, streaming the keys in tiles with the online softmax (running max and
sum, as FlashAttention does). The prefix is one launch whose query rows are every member's
query heads of a KV head stacked together (a matrix-matrix product per tile); each member's
own suffix is a launch over its slots; `attention.merge` combines the two by their
log-sum-exp. Keys and values are read straight from the paged cache ([slots, kv heads, dim])
through the slot indexes.

Correctness is tested on the CPU with Triton's interpreter (TRITON_INTERPRET=1) against the
torch path; timing it needs a GPU (benchmarks/shared_prefix.py). Products run in IEEE float32
(`input_precision="ieee"`: no TF32), so GPU results keep the interpreter's tolerance. Triton
is not a dependency of qlm: it is imported only when this module is; the vLLM environment
has it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

from qlm.engine.native.attention import merge

BLOCK_M = 16  # query rows per program
BLOCK_N = 16  # keys per tile


@triton.jit
def _attend_slots(
    q_ptr,
    k_ptr,
    v_ptr,
    slots_ptr,
    out_ptr,
    lse_ptr,
    rows,
    length,
    scale,
    stride_qh,
    stride_qm,
    stride_ks,
    stride_kh,
    dim_size: tl.constexpr,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
):
    """Program (row block, kv head): rows of q[head] attend to keys at slots[0:length]."""
    block = tl.program_id(0)
    head = tl.program_id(1)
    row = block * block_m + tl.arange(0, block_m)
    dim = tl.arange(0, dim_size)
    row_ok = row < rows
    q = tl.load(
        q_ptr + head * stride_qh + row[:, None] * stride_qm + dim[None, :],
        mask=row_ok[:, None],
        other=0.0,
    )
    top = tl.full([block_m], float("-inf"), tl.float32)
    total = tl.zeros([block_m], tl.float32)
    acc = tl.zeros([block_m, dim_size], tl.float32)
    for start in range(0, length, block_n):
        col = start + tl.arange(0, block_n)
        col_ok = col < length
        slot = tl.load(slots_ptr + col, mask=col_ok, other=0)
        at = slot[:, None] * stride_ks + head * stride_kh + dim[None, :]
        k = tl.load(k_ptr + at, mask=col_ok[:, None], other=0.0)
        v = tl.load(v_ptr + at, mask=col_ok[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        scores = tl.where(col_ok[None, :], scores, float("-inf"))
        new_top = tl.maximum(top, tl.max(scores, 1))
        p = tl.exp(scores - new_top[:, None])
        keep = tl.exp(top - new_top)
        total = total * keep + tl.sum(p, 1)
        acc = acc * keep[:, None] + tl.dot(p, v, input_precision="ieee")
        top = new_top
    out = acc / total[:, None]
    tl.store(
        out_ptr + head * stride_qh + row[:, None] * stride_qm + dim[None, :],
        out,
        mask=row_ok[:, None],
    )
    tl.store(lse_ptr + head * rows + row, top + tl.log(total), mask=row_ok)


def attend_slots(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [kv heads, rows, dim], lse [kv heads, rows]) of query rows q [kv heads, rows,
    dim] over every key at `slots` of the caches [slots, kv heads, dim] (no mask: the keys
    all come before the queries)."""
    kv_heads, rows, dim = q.shape
    if dim & (dim - 1) or dim < 16:
        raise ValueError(f"head dim {dim}: the kernel needs a power of two >= 16")
    q = q.contiguous()
    out = torch.empty_like(q)
    lse = torch.empty(kv_heads, rows, dtype=torch.float32, device=q.device)
    grid = (triton.cdiv(rows, BLOCK_M), kv_heads)
    _attend_slots[grid](
        q,
        k_cache,
        v_cache,
        slots.to(torch.int64).contiguous(),
        out,
        lse,
        rows,
        slots.numel(),
        scale,
        q.stride(0),
        q.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        dim_size=dim,
        block_m=BLOCK_M,
        block_n=BLOCK_N,
    )
    return out, lse


def shared_prefix_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_slots: torch.Tensor,
    own_slots: Sequence[torch.Tensor],
    scale: float,
) -> torch.Tensor:
    """One decode token per member (q [members, heads, dim]) over the shared prefix (read once
    for all members) and each member's own slots: the output [members, heads, dim]."""
    members, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    stacked = q.view(members, kv_heads, group, dim).permute(1, 0, 2, 3)
    shared_out, shared_lse = attend_slots(
        stacked.reshape(kv_heads, members * group, dim), k_cache, v_cache, prefix_slots, scale
    )
    outputs = []
    for i, slots in enumerate(own_slots):
        rows = q[i].view(kv_heads, group, dim)
        own = attend_slots(rows, k_cache, v_cache, slots, scale)
        shared = (
            shared_out[:, i * group : (i + 1) * group],
            shared_lse[:, i * group : (i + 1) * group],
        )
        outputs.append(merge(shared, own).reshape(heads, dim))
    return torch.stack(outputs)
