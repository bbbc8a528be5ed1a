"""Shared-prefix attention (qlm/engine/native/attention.py) against attending to each whole
context: the same outputs for decode tokens and prompt chunks, with grouped-query heads."""

from __future__ import annotations

import math

import pytest
import torch

from qlm.engine.native.attention import (
    attend,
    merge,
    per_sequence_attention,
    shared_prefix_attention,
)

HEADS, KV_HEADS, DIM = 8, 2, 16
SCALE = 1 / math.sqrt(DIM)


def kv(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, KV_HEADS, DIM, generator=gen), torch.randn(
        n, KV_HEADS, DIM, generator=gen
    )


@pytest.mark.parametrize(("prefix_len", "queries"), [(64, [1, 1, 1]), (40, [1, 5, 3, 1])])
def test_the_shared_path_gives_each_member_its_whole_context_attention(
    prefix_len: int, queries: list[int]
) -> None:
    gen = torch.Generator().manual_seed(0)
    prefix = kv(prefix_len, gen)
    suffix_lens = [n + 3 * i for i, n in enumerate(queries)]  # own tokens before the queries
    suffixes = [kv(n, gen) for n in suffix_lens]
    qs = [torch.randn(n, HEADS, DIM, generator=gen) for n in queries]
    starts = [prefix_len + s - n for s, n in zip(suffix_lens, queries, strict=True)]
    contexts = [(torch.cat([prefix[0], k]), torch.cat([prefix[1], v])) for k, v in suffixes]
    shared = shared_prefix_attention(qs, starts, prefix, suffixes, SCALE)
    alone = per_sequence_attention(qs, starts, contexts, SCALE)
    for got, want in zip(shared, alone, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_attend_is_scaled_dot_product_attention_with_a_causal_offset() -> None:
    gen = torch.Generator().manual_seed(1)
    k, v = kv(12, gen)
    q = torch.randn(4, HEADS, DIM, generator=gen)
    out, _ = attend(q, k, v, 8, SCALE)
    mask = torch.arange(12).unsqueeze(0) <= torch.arange(8, 12).unsqueeze(1)
    want = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(0, 1),
        k.transpose(0, 1),
        v.transpose(0, 1),
        attn_mask=mask,
        scale=SCALE,
        enable_gqa=True,
    ).transpose(0, 1)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)


def test_merging_two_halves_of_the_keys_is_attending_to_all() -> None:
    gen = torch.Generator().manual_seed(2)
    k, v = kv(30, gen)
    q = torch.randn(1, HEADS, DIM, generator=gen)
    whole, _ = attend(q, k, v, 29, SCALE)
    halves = merge(attend(q, k[:13], v[:13], 29, SCALE), attend(q, k[13:], v[13:], 29, SCALE))
    torch.testing.assert_close(halves, whole, atol=1e-6, rtol=1e-5)
