"""The Llama forward pass over a batch of sequence pieces, reading and writing paged KV.

Question answered: given this step's tokens of several sequences (whole prompts, prompt
chunks, single decode tokens), what are the next-token logits? Tokens of all pieces go
through the projections and the MLP as one matrix (continuous batching); each piece's
attention reads its own context from the paged cache: every position before its first token
(a prefix computed earlier, or shared with a forked parent) plus its own tokens, causally.
Float32 on the CPU; the arithmetic follows Hugging Face's LlamaForCausalLM (RMSNorm, rotary
embeddings on halves, grouped-query attention, SwiGLU).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F  # noqa: N812 (torch's convention)

from qlm.engine.native.attention import attend, shared_prefix_attention
from qlm.engine.native.blocks import KvCache
from qlm.engine.native.checkpoint import Checkpoint, LlamaShape


@dataclass(frozen=True, slots=True)
class Piece:
    """One sequence's part of a step: `tokens` at positions [start, start + len(tokens)),
    their cache slots (`slots`), the slots of every position up to the last (`context`), and
    whether the step returns logits for its last token."""

    tokens: Sequence[int]
    start: int
    slots: torch.Tensor
    context: torch.Tensor
    wants_logits: bool = True
    # Pieces with the same group >= 0 share their first `prefix_tokens` context slots (all
    # before their first token): the prefix's K and V are read once for the group.
    prefix_group: int = -1
    prefix_tokens: int = 0


class LlamaModel:
    def __init__(self, checkpoint: Checkpoint) -> None:
        self.shape: LlamaShape = checkpoint.shape
        self.w = checkpoint.weights
        shape = self.shape
        half = torch.arange(0, shape.head_dim, 2, dtype=torch.float32) / shape.head_dim
        self._inv_freq = 1.0 / (shape.rope_theta**half)
        self._scale = 1.0 / math.sqrt(shape.head_dim)

    @torch.inference_mode()
    def forward(self, pieces: Sequence[Piece], cache: KvCache) -> torch.Tensor:
        """Logits [pieces wanting them, vocab] of each such piece's last token, in order;
        writes every piece's K and V into its slots."""
        shape = self.shape
        tokens = torch.tensor([t for p in pieces for t in p.tokens], dtype=torch.long)
        positions = torch.cat([torch.arange(p.start, p.start + len(p.tokens)) for p in pieces])
        slots = torch.cat([p.slots for p in pieces])
        cos, sin = self._rotary(positions)
        h = self.w["embed_tokens.weight"][tokens]
        for layer in range(shape.num_layers):
            prefix = f"layers.{layer}."
            x = self._norm(h, prefix + "input_layernorm.weight")
            attn = self._attention(x, layer, cos, sin, slots, pieces, cache)
            h = h + attn @ self.w[prefix + "self_attn.o_proj.weight"].T
            x = self._norm(h, prefix + "post_attention_layernorm.weight")
            gate = F.silu(x @ self.w[prefix + "mlp.gate_proj.weight"].T)
            up = x @ self.w[prefix + "mlp.up_proj.weight"].T
            h = h + (gate * up) @ self.w[prefix + "mlp.down_proj.weight"].T
        ends = torch.tensor(_last_rows(pieces), dtype=torch.long)
        last = self._norm(h[ends], "norm.weight")
        return last @ self.w["lm_head.weight"].T

    def _attention(
        self,
        x: torch.Tensor,
        layer: int,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: torch.Tensor,
        pieces: Sequence[Piece],
        cache: KvCache,
    ) -> torch.Tensor:
        shape, prefix = self.shape, f"layers.{layer}.self_attn."
        n = x.shape[0]
        q = (x @ self.w[prefix + "q_proj.weight"].T).view(n, shape.num_heads, shape.head_dim)
        k = (x @ self.w[prefix + "k_proj.weight"].T).view(n, shape.num_kv_heads, shape.head_dim)
        v = (x @ self.w[prefix + "v_proj.weight"].T).view(n, shape.num_kv_heads, shape.head_dim)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        cache.k[layer, slots] = k
        cache.v[layer, slots] = v
        out = self._attend_pieces(q, pieces, layer, cache)
        return out.reshape(n, shape.num_heads * shape.head_dim)

    def _attend_pieces(
        self, q: torch.Tensor, pieces: Sequence[Piece], layer: int, cache: KvCache
    ) -> torch.Tensor:
        """Each piece's attention output rows; prefix groups through the shared path."""
        out = torch.empty_like(q)
        rows, row = [], 0
        groups: dict[int, list[int]] = {}
        for i, piece in enumerate(pieces):
            rows.append(row)
            row += len(piece.tokens)
            if piece.prefix_group >= 0:
                groups.setdefault(piece.prefix_group, []).append(i)
            else:
                out[rows[i] : row] = self._piece_attention(q[rows[i] : row], piece, layer, cache)
        for members in groups.values():
            group = [pieces[i] for i in members]
            queries = [q[rows[i] : rows[i] + len(pieces[i].tokens)] for i in members]
            for i, result in zip(members, self._shared(queries, group, layer, cache), strict=True):
                out[rows[i] : rows[i] + len(pieces[i].tokens)] = result
        return out

    def _shared(
        self, queries: list[torch.Tensor], group: list[Piece], layer: int, cache: KvCache
    ) -> list[torch.Tensor]:
        """A prefix group's attention: the prefix read once, each member's suffix alone."""
        prefix_slots = group[0].context[: group[0].prefix_tokens]
        prefix = (cache.k[layer, prefix_slots], cache.v[layer, prefix_slots])
        suffixes = []
        for piece in group:
            own = piece.context[piece.prefix_tokens :]
            suffixes.append((cache.k[layer, own], cache.v[layer, own]))
        starts = [p.start for p in group]
        return shared_prefix_attention(queries, starts, prefix, suffixes, self._scale)

    def _piece_attention(
        self, q: torch.Tensor, piece: Piece, layer: int, cache: KvCache
    ) -> torch.Tensor:
        """Causal attention of the piece's queries [count, heads, dim] over its context."""
        keys, values = cache.k[layer, piece.context], cache.v[layer, piece.context]
        return attend(q, keys, values, piece.start, self._scale)[0]

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32).unsqueeze(1) * self._inv_freq.unsqueeze(0)
        angles = torch.cat([freqs, freqs], dim=-1).unsqueeze(1)  # [tokens, 1, head_dim]
        return angles.cos(), angles.sin()

    def _norm(self, x: torch.Tensor, weight: str) -> torch.Tensor:
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.w[weight] * (x * torch.rsqrt(variance + self.shape.rms_norm_eps))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + turned * sin


def _last_rows(pieces: Sequence[Piece]) -> list[int]:
    rows, row = [], 0
    for piece in pieces:
        row += len(piece.tokens)
        if piece.wants_logits:
            rows.append(row - 1)
    return rows
