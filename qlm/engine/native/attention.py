"""Attention over paged KV, per sequence and with a shared prefix read once.

Question answered: how do queries attend to their context, and how is a prefix that many
sequences of a batch share read only once? Attention splits over any partition of the keys:
attending to the prefix and to the rest separately gives two partial outputs with the
log-sum-exp of their scores, and the exact result is their average weighted by
exp(lse) (`merge`). So for a group of sequences sharing a prefix (forks of one parent, the
same system prompt), the group's queries of all members are stacked into one matrix and
multiplied with the prefix's keys once (a matrix-matrix product instead of one
matrix-vector product per sequence: the cascade idea of Hydragen, ChunkAttention and
FlashInfer), then each member attends to its own suffix, and the two are merged.

Shapes: queries [tokens, heads, dim]; keys and values [context, kv_heads, dim], heads a
multiple of kv_heads (grouped-query attention: query head h reads kv head h // group).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn.utils.rnn import pad_sequence


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [n, heads, dim], lse [n, heads]) of queries at positions start..start+n-1
    over keys at positions 0..len(k)-1, causally (a query sees keys at or before it). With
    `start` >= len(k) every key is visible (the prefix part of a shared-prefix step)."""
    n, heads, dim = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    qg = q.view(n, kv_heads, group, dim).permute(1, 0, 2, 3).reshape(kv_heads, n * group, dim)
    scores = torch.bmm(qg, k.permute(1, 2, 0)) * scale  # [kv_heads, n * group, context]
    context = k.shape[0]
    if start + 1 < context:  # some query does not see every key
        query_at = torch.arange(start, start + n).repeat_interleave(group)
        hidden = torch.arange(context).unsqueeze(0) > query_at.unsqueeze(1)
        scores = scores.masked_fill(hidden, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [kv_heads, n * group]
    out = torch.bmm(torch.exp(scores - lse.unsqueeze(-1)), v.permute(1, 0, 2))
    out = out.view(kv_heads, n, group, dim).permute(1, 0, 2, 3).reshape(n, heads, dim)
    return out, lse.view(kv_heads, n, group).permute(1, 0, 2).reshape(n, heads)


def merge(
    first: tuple[torch.Tensor, torch.Tensor], second: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """The attention over both key sets from each one's (output, lse)."""
    (out_a, lse_a), (out_b, lse_b) = first, second
    top = torch.maximum(lse_a, lse_b)
    w_a = torch.exp(lse_a - top).unsqueeze(-1)
    w_b = torch.exp(lse_b - top).unsqueeze(-1)
    return (out_a * w_a + out_b * w_b) / (w_a + w_b)


def shared_prefix_attention(
    queries: Sequence[torch.Tensor],
    starts: Sequence[int],
    prefix: tuple[torch.Tensor, torch.Tensor],
    suffixes: Sequence[tuple[torch.Tensor, torch.Tensor]],
    scale: float,
) -> list[torch.Tensor]:
    """Each member's attention output: its queries (at positions starts[i]..) over the shared
    prefix's keys and values (read once for the group) and its own suffix (the positions
    after the prefix up to its last query)."""
    prefix_len = prefix[0].shape[0]
    stacked = torch.cat(list(queries))
    # Every member's queries come after the whole prefix: no mask over it.
    shared_out, shared_lse = attend(stacked, prefix[0], prefix[1], prefix_len, scale)
    if stacked.shape[0] == len(queries):  # one token each (decode): the suffixes in one go
        own = attend_padded(stacked, suffixes, scale)
        return [row.unsqueeze(0) for row in merge((shared_out, shared_lse), own).unbind(0)]
    outputs, row = [], 0
    for q, start, (k, v) in zip(queries, starts, suffixes, strict=True):
        n = q.shape[0]
        own = attend(q, k, v, start - prefix_len, scale)
        shared = (shared_out[row : row + n], shared_lse[row : row + n])
        outputs.append(merge(shared, own))
        row += n
    return outputs


def attend_padded(
    q: torch.Tensor, contexts: Sequence[tuple[torch.Tensor, torch.Tensor]], scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [b, heads, dim], lse [b, heads]) of one query per member (q: [b, heads, dim])
    over all of its own keys, the members' keys padded to the longest and masked."""
    keys = pad_sequence([k for k, _ in contexts], batch_first=True)  # [b, L, kv_heads, dim]
    values = pad_sequence([v for _, v in contexts], batch_first=True)
    b, heads, dim = q.shape
    kv_heads = keys.shape[2]
    qg = q.view(b, kv_heads, heads // kv_heads, dim)
    scores = torch.einsum("bkgd,blkd->bkgl", qg, keys) * scale
    lengths = torch.tensor([k.shape[0] for k, _ in contexts], device=keys.device)
    padding = torch.arange(keys.shape[1], device=keys.device)[None] >= lengths[:, None]  # [b, L]
    scores = scores.masked_fill(padding[:, None, None, :], float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    out = torch.einsum("bkgl,blkd->bkgd", torch.exp(scores - lse.unsqueeze(-1)), values)
    return out.reshape(b, heads, dim), lse.reshape(b, heads)


def per_sequence_attention(
    queries: Sequence[torch.Tensor],
    starts: Sequence[int],
    contexts: Sequence[tuple[torch.Tensor, torch.Tensor]],
    scale: float,
) -> list[torch.Tensor]:
    """Each member over its whole context, prefix included (the reference path)."""
    return [
        attend(q, k, v, start, scale)[0]
        for q, start, (k, v) in zip(queries, starts, contexts, strict=True)
    ]
