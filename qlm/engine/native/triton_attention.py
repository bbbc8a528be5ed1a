"""Shared-prefix decode attention as a Triton kernel, for GPUs (the torch path in attention.py
serves the CPU).

Question answered: how does a GPU read a shared prefix once for a batch? One kernel,
`_attend_parts`, computes attention with its log-sum-exp for a block of query rows over a
part of a segment of cache slots, streaming the keys in tiles with the online softmax (running
max and sum, as FlashAttention does); long segments are split into parts so that a launch
fills the GPU, and the parts are combined by their log-sum-exp (split-K, as flash-decoding
does). The prefix is one launch of one segment whose query rows are
every member's query heads of a KV head stacked together (a matrix-matrix product per tile);
the members' own suffixes are one launch of one segment per member; one more launch,
`_combine_parts`, combines each member's parts of both by their log-sum-exp. Keys and values
are read straight from the paged cache ([slots, kv heads, dim]) through the slot indexes.

Correctness is tested on the CPU with Triton's interpreter (TRITON_INTERPRET=1) against the
torch path; timing it needs a GPU (benchmarks/shared_prefix_gpu.py). Products run in IEEE float32
(`input_precision="ieee"`: no TF32), so GPU results keep the interpreter's tolerance. Triton
is not a dependency of qlm: it is imported only when this module is; the vLLM environment
has it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl

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
    """[firsts, lengths, owners, bounds] of the parts, each segment cut into parts of `size`
    keys: a part's first slot (in the segments' slots one after another), its length and
    its segment; bounds: each segment's first part, then the part count."""
    firsts: list[int] = []
    sizes: list[int] = []
    owners: list[int] = []
    bounds: list[int] = []
    start = 0
    for owner, length in enumerate(lengths):
        bounds.append(len(firsts))
        for offset in range(0, length, size):
            firsts.append(start + offset)
            sizes.append(min(size, length - offset))
            owners.append(owner)
        start += length
    return [firsts, sizes, owners, [*bounds, len(firsts)]]


@triton.jit
def _absorb(top, total, acc, lse_ptr, out_ptr, at, row_ok, dim_size: tl.constexpr):
    """One part (its lse and output at rows `at`) into a block's running log-sum-exp (`top`
    and `total`) and weighted output sum (`acc`)."""
    dim = tl.arange(0, dim_size)
    lse = tl.load(lse_ptr + at, mask=row_ok, other=0.0)
    out = tl.load(out_ptr + at[:, None] * dim_size + dim[None, :], mask=row_ok[:, None])
    new_top = tl.maximum(top, lse)
    weight = tl.exp(lse - new_top)
    keep = tl.exp(top - new_top)
    return new_top, total * keep + weight, acc * keep[:, None] + out * weight[:, None]


@triton.jit
def _combine_parts(
    out_ptr,
    lse_ptr,
    bounds_ptr,
    pre_out_ptr,
    pre_lse_ptr,
    pre_parts,
    pre_rows,
    pre_row_step,
    final_ptr,
    final_lse_ptr,
    rows,
    dim_size: tl.constexpr,
    block_m: tl.constexpr,
):
    """Program (row block, kv head, owner): the owner's rows over all of its parts by their
    log-sum-exp (online, part by part): the `pre_parts` parts of a shared source first (its
    rows owner * pre_row_step + row of pre_rows), then the owner's own parts
    (bounds[owner] up to bounds[owner + 1]). Parts are [part, kv head, row, dim]."""
    block = tl.program_id(0)
    head = tl.program_id(1)
    owner = tl.program_id(2)
    heads = tl.num_programs(1)
    row = block * block_m + tl.arange(0, block_m)
    dim = tl.arange(0, dim_size)
    row_ok = row < rows
    top = tl.full([block_m], float("-inf"), tl.float32)
    total = tl.zeros([block_m], tl.float32)
    acc = tl.zeros([block_m, dim_size], tl.float32)
    pre_row = owner * pre_row_step + row
    for part in range(0, pre_parts):
        at = (part * heads + head) * pre_rows + pre_row
        top, total, acc = _absorb(top, total, acc, pre_lse_ptr, pre_out_ptr, at, row_ok, dim_size)
    for part in range(tl.load(bounds_ptr + owner), tl.load(bounds_ptr + owner + 1)):
        at = (part * heads + head) * rows + row
        top, total, acc = _absorb(top, total, acc, lse_ptr, out_ptr, at, row_ok, dim_size)
    at = (owner * heads + head) * rows + row
    tl.store(
        final_ptr + at[:, None] * dim_size + dim[None, :],
        acc / total[:, None],
        mask=row_ok[:, None],
    )
    tl.store(final_lse_ptr + at, top + tl.log(total), mask=row_ok)


Parts = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # out, lse, bounds (parts_of)


def combine(
    parts: Parts, pre: Parts | None = None, pre_row_step: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each owner's attention over all its parts (and over every part of `pre`, rows
    owner * pre_row_step on), from their (output, lse) by log-sum-exp, in one launch: (output
    [owners, kv heads, rows, dim], lse [owners, kv heads, rows])."""
    out, lse, bounds = parts
    _, kv_heads, rows, dim = out.shape
    owners = bounds.numel() - 1
    final = torch.empty(owners, kv_heads, rows, dim, dtype=torch.float32, device=out.device)
    final_lse = torch.empty(owners, kv_heads, rows, dtype=torch.float32, device=out.device)
    pre_out, pre_lse = (out, lse) if pre is None else pre[:2]
    _combine_parts[(triton.cdiv(rows, BLOCK_M), kv_heads, owners)](
        out,
        lse,
        bounds,
        pre_out,
        pre_lse,
        0 if pre is None else pre_out.shape[0],
        pre_out.shape[2],
        pre_row_step,
        final,
        final_lse,
        rows,
        dim_size=dim,
        block_m=BLOCK_M,
    )
    return final, final_lse


def attend_parts(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    lengths: Sequence[int],
    scale: float,
) -> Parts:
    """Segment i's query rows q[i] ([kv heads, rows, dim]) over its keys, the next
    lengths[i] slots of `slots` (the segments' slots one after another), in one launch whose
    long segments are split into parts (split-K): the parts' (output [parts, kv heads, rows,
    dim], lse [parts, kv heads, rows]) and each segment's first part (and the end), for
    `combine`. No mask: the keys all come before the queries. Every segment needs a key (an
    empty one has no softmax)."""
    segments, kv_heads, rows, dim = q.shape
    if dim & (dim - 1) or dim < 16:
        raise ValueError(f"head dim {dim}: the kernel needs a power of two >= 16")
    if len(lengths) != segments or min(lengths) < 1:
        raise ValueError(f"segment lengths {list(lengths)}: one >= 1 per segment of q")
    q = q.contiguous()
    row_blocks = triton.cdiv(rows, BLOCK_M)
    cut = parts_of(lengths, split_keys(lengths, row_blocks, kv_heads))
    parts = len(cut[0])
    meta = torch.tensor([x for column in cut for x in column], dtype=torch.int64).to(q.device)
    out = torch.empty(parts, kv_heads, rows, dim, dtype=torch.float32, device=q.device)
    lse = torch.empty(parts, kv_heads, rows, dtype=torch.float32, device=q.device)
    _attend_parts[(row_blocks, kv_heads, parts)](
        q,
        k_cache,
        v_cache,
        slots.to(torch.int64).contiguous(),
        meta,
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
    return out, lse, meta[3 * parts :]


def attend_segments(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slots: torch.Tensor,
    lengths: Sequence[int],
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [segments, kv heads, rows, dim], lse [segments, kv heads, rows]) of
    `attend_parts`'s segments, their parts combined (when a segment was split)."""
    parts = attend_parts(q, k_cache, v_cache, slots, lengths, scale)
    if parts[0].shape[0] == len(lengths):
        return parts[0], parts[1]
    return combine(parts)


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
    stacked = grouped.permute(1, 0, 2, 3).reshape(1, kv_heads, members * group, dim)
    prefix = attend_parts(stacked, k_cache, v_cache, prefix_slots, [prefix_slots.numel()], scale)
    own = attend_parts(
        grouped, k_cache, v_cache, torch.cat(list(own_slots)), [s.numel() for s in own_slots], scale
    )
    return combine(own, prefix, group)[0].reshape(members, heads, dim)
