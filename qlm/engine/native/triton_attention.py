"""Shared-prefix decode attention as a Triton kernel, for GPUs (the torch path in attention.py
serves the CPU).

Question answered: how does a GPU read a shared prefix once for a batch? One kernel,
`_attend_parts`, computes attention with its log-sum-exp for a block of query rows over a
part of a segment of cache slots, streaming the keys in tiles with the online softmax (running
max and sum, as FlashAttention does); long segments are split into parts so that a launch
fills the GPU, and the parts are combined by their log-sum-exp (split-K, as flash-decoding
does). The prefix is one launch of one segment whose query rows are
every member's query heads of a KV head stacked together (a matrix-matrix product per tile);
the members' own suffixes are one launch of one segment per member; `attention.merge`
combines the two by their log-sum-exp. Keys and values are read straight from the paged
cache ([slots, kv heads, dim]) through the slot indexes.

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
MIN_SPLIT_KEYS = 64  # a part of a segment has at least this many keys (but for its last part)
TARGET_PROGRAMS = 256  # long segments are split into parts until a launch has about this many


@triton.jit
def _attend_parts(
    q_ptr,
    k_ptr,
    v_ptr,
    slots_ptr,
    meta_ptr,
    out_ptr,
    lse_ptr,
    rows,
    parts,
    scale,
    stride_qs,
    stride_os,
    stride_qh,
    stride_qm,
    stride_ks,
    stride_kh,
    dim_size: tl.constexpr,
    block_m: tl.constexpr,
    block_n: tl.constexpr,
):
    """Program (row block, kv head, part): the rows of q[owner, head] attend to the part's
    keys, slots[first:first + length]; meta holds (first, length, owner) per part."""
    block = tl.program_id(0)
    head = tl.program_id(1)
    part = tl.program_id(2)
    first = tl.load(meta_ptr + part)
    length = tl.load(meta_ptr + parts + part)
    owner = tl.load(meta_ptr + 2 * parts + part)
    row = block * block_m + tl.arange(0, block_m)
    dim = tl.arange(0, dim_size)
    row_ok = row < rows
    at_q = head * stride_qh + row[:, None] * stride_qm + dim[None, :]
    q = tl.load(q_ptr + owner * stride_qs + at_q, mask=row_ok[:, None], other=0.0)
    top = tl.full([block_m], float("-inf"), tl.float32)
    total = tl.zeros([block_m], tl.float32)
    acc = tl.zeros([block_m, dim_size], tl.float32)
    for start in range(0, length, block_n):
        col = start + tl.arange(0, block_n)
        col_ok = col < length
        slot = tl.load(slots_ptr + first + col, mask=col_ok, other=0)
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
    tl.store(out_ptr + part * stride_os + at_q, acc / total[:, None], mask=row_ok[:, None])
    lse_at = (part * tl.num_programs(1) + head) * rows + row
    tl.store(lse_ptr + lse_at, top + tl.log(total), mask=row_ok)


def split_keys(lengths: Sequence[int], row_blocks: int, kv_heads: int) -> int:
    """Keys per part: segments split until a launch has about TARGET_PROGRAMS programs (a
    short batch of long segments would leave most of a GPU idle), parts of at least
    MIN_SPLIT_KEYS keys, a whole number of tiles."""
    per_program = sum(lengths) * row_blocks * kv_heads // TARGET_PROGRAMS
    return max(MIN_SPLIT_KEYS, per_program // BLOCK_N * BLOCK_N)


def parts_of(lengths: Sequence[int], size: int) -> list[list[int]]:
    """[firsts, lengths, owners] of the parts: each segment cut into parts of `size` keys."""
    firsts: list[int] = []
    sizes: list[int] = []
    owners: list[int] = []
    start = 0
    for owner, length in enumerate(lengths):
        for offset in range(0, length, size):
            firsts.append(start + offset)
            sizes.append(min(size, length - offset))
            owners.append(owner)
        start += length
    return [firsts, sizes, owners]


def combine(
    out: torch.Tensor, lse: torch.Tensor, owners: torch.Tensor, segments: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each owner's attention over all its parts, from the parts' (output, lse) by their
    log-sum-exp, as `attention.merge` does for two."""
    index = owners.view(-1, 1, 1).expand_as(lse)
    shape = (segments, *lse.shape[1:])
    top = torch.full(shape, float("-inf"), device=lse.device).scatter_reduce(0, index, lse, "amax")
    weight = torch.exp(lse - top.gather(0, index))
    total = torch.zeros(shape, device=lse.device).index_add_(0, owners, weight)
    acc = torch.zeros(segments, *out.shape[1:], device=out.device)
    acc.index_add_(0, owners, out * weight.unsqueeze(-1))
    return acc / total.unsqueeze(-1), top + torch.log(total)


def attend_segments(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    lengths: Sequence[int],
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [segments, kv heads, rows, dim], lse [segments, kv heads, rows]): segment i's
    query rows q[i] ([kv heads, rows, dim]) over its keys, the next lengths[i] slots of
    `slots` (the segments' slots one after another), in one launch whose long segments are
    split into parts (split-K, then `combine`). No mask: the keys all come before the
    queries. Every segment needs a key (an empty one has no softmax)."""
    segments, kv_heads, rows, dim = q.shape
    if dim & (dim - 1) or dim < 16:
        raise ValueError(f"head dim {dim}: the kernel needs a power of two >= 16")
    if len(lengths) != segments or min(lengths) < 1:
        raise ValueError(f"segment lengths {list(lengths)}: one >= 1 per segment of q")
    q = q.contiguous()
    row_blocks = triton.cdiv(rows, BLOCK_M)
    meta = parts_of(lengths, split_keys(lengths, row_blocks, kv_heads))
    parts = len(meta[0])
    meta_on = torch.tensor(meta, dtype=torch.int64).to(q.device)
    out = torch.empty(parts, kv_heads, rows, dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(parts, kv_heads, rows, dtype=torch.float32, device=q.device)
    _attend_parts[(row_blocks, kv_heads, parts)](
        q,
        k_cache,
        v_cache,
        slots.to(torch.int64).contiguous(),
        meta_on,
        out,
        lse,
        rows,
        parts,
        scale,
        q.stride(0),
        out.stride(0),
        q.stride(1),
        q.stride(2),
        k_cache.stride(0),
        k_cache.stride(1),
        dim_size=dim,
        block_m=BLOCK_M,
        block_n=BLOCK_N,
    )
    if parts == segments:
        return out, lse
    return combine(out, lse, meta_on[2], segments)


def attend_slots(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [kv heads, rows, dim], lse [kv heads, rows]) of query rows q [kv heads, rows,
    dim] over every key at `slots` of the caches [slots, kv heads, dim]: one segment."""
    out, lse = attend_segments(q.unsqueeze(0), k_cache, v_cache, slots, [slots.numel()], scale)
    return out[0], lse[0]


def shared_prefix_decode(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    prefix_slots: torch.Tensor,
    own_slots: Sequence[torch.Tensor],
    scale: float,
) -> torch.Tensor:
    """One decode token per member (q [members, heads, dim]) over the shared prefix (read once
    for all members: one launch) and each member's own slots (one launch for all members):
    the output [members, heads, dim]."""
    members, heads, dim = q.shape
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    grouped = q.view(members, kv_heads, group, dim)
    stacked = grouped.permute(1, 0, 2, 3).reshape(kv_heads, members * group, dim)
    shared_out, shared_lse = attend_slots(stacked, k_cache, v_cache, prefix_slots, scale)
    shared = (
        shared_out.view(kv_heads, members, group, dim).permute(1, 0, 2, 3),
        shared_lse.view(kv_heads, members, group).permute(1, 0, 2),
    )
    own = attend_segments(
        grouped, k_cache, v_cache, torch.cat(list(own_slots)), [s.numel() for s in own_slots], scale
    )
    return merge(shared, own).reshape(members, heads, dim)
