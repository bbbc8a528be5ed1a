"""Tiny random Llamas for the native engine's tests, built in-process (no transformers): in
memory (`random_checkpoint`) or on disk in Hugging Face's layout (`write_checkpoint`)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
from safetensors.torch import save_file

from qlm.engine.native.checkpoint import Checkpoint, LlamaShape

SHAPE = LlamaShape(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
    eos_token_ids=(),
)


def weight_shapes(s: LlamaShape) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {
        "embed_tokens.weight": (s.vocab_size, s.hidden_size),
        "norm.weight": (s.hidden_size,),
        "lm_head.weight": (s.vocab_size, s.hidden_size),
    }
    for layer in range(s.num_layers):
        p = f"layers.{layer}."
        shapes |= {
            p + "input_layernorm.weight": (s.hidden_size,),
            p + "post_attention_layernorm.weight": (s.hidden_size,),
            p + "self_attn.q_proj.weight": (s.num_heads * s.head_dim, s.hidden_size),
            p + "self_attn.k_proj.weight": (s.num_kv_heads * s.head_dim, s.hidden_size),
            p + "self_attn.v_proj.weight": (s.num_kv_heads * s.head_dim, s.hidden_size),
            p + "self_attn.o_proj.weight": (s.hidden_size, s.num_heads * s.head_dim),
            p + "mlp.gate_proj.weight": (s.intermediate_size, s.hidden_size),
            p + "mlp.up_proj.weight": (s.intermediate_size, s.hidden_size),
            p + "mlp.down_proj.weight": (s.hidden_size, s.intermediate_size),
        }
    return shapes


def random_checkpoint(seed: int = 0, shape: LlamaShape = SHAPE) -> Checkpoint:
    gen = torch.Generator().manual_seed(seed)
    weights = {
        name: torch.randn(size, generator=gen) * 0.3 for name, size in weight_shapes(shape).items()
    }
    return Checkpoint(Path("random"), shape, weights)


def write_checkpoint(path: Path, seed: int = 0, shape: LlamaShape = SHAPE) -> Path:
    """A random Llama in `path` (config.json, model.safetensors); no tokenizer."""
    path.mkdir(parents=True, exist_ok=True)
    checkpoint = random_checkpoint(seed, replace(shape))
    config = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": shape.vocab_size,
        "hidden_size": shape.hidden_size,
        "intermediate_size": shape.intermediate_size,
        "num_hidden_layers": shape.num_layers,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "max_position_embeddings": shape.max_position_embeddings,
    }
    (path / "config.json").write_text(json.dumps(config))
    tensors = {f"model.{name}": t.contiguous() for name, t in checkpoint.weights.items()}
    tensors["lm_head.weight"] = tensors.pop("model.lm_head.weight")
    save_file(tensors, str(path / "model.safetensors"))
    return path
