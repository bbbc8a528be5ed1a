"""A Llama checkpoint on disk: its shape (`LlamaShape`, from config.json) and its weights.

Question answered: what does the native engine serve, and what does it refuse? A directory in
Hugging Face's layout (config.json, *.safetensors) whose `architectures` names
LlamaForCausalLM (Llama, Llama-2/3 and the many models of that shape). Settings the forward
pass does not implement (rope scaling, attention or MLP biases, an activation other than SiLU)
are refused with the file and the field named, never ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

ARCHITECTURE = "LlamaForCausalLM"


class CheckpointError(ValueError):
    """A checkpoint the native engine cannot serve; the message names the file and field."""


@dataclass(frozen=True, slots=True)
class LlamaShape:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    eos_token_ids: tuple[int, ...]

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token, in float32."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 4


@dataclass(frozen=True, slots=True)
class Checkpoint:
    path: Path
    shape: LlamaShape
    weights: dict[str, torch.Tensor]


def read_shape(path: Path) -> LlamaShape:
    """The model's shape from `path`/config.json; CheckpointError on what is not served."""
    config_path = path / "config.json"
    try:
        raw: dict[str, Any] = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{config_path}: {exc}") from exc
    _refuse_unsupported(config_path, raw)
    heads = int(raw["num_attention_heads"])
    hidden = int(raw["hidden_size"])
    eos = raw.get("eos_token_id")
    eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list) else (int(eos),)
    return LlamaShape(
        vocab_size=int(raw["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(raw["intermediate_size"]),
        num_layers=int(raw["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(raw.get("num_key_value_heads") or heads),
        head_dim=int(raw.get("head_dim") or hidden // heads),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        eos_token_ids=eos_ids,
    )


def _refuse_unsupported(config_path: Path, raw: dict[str, Any]) -> None:
    architectures = raw.get("architectures") or []
    if ARCHITECTURE not in architectures:
        raise CheckpointError(
            f"{config_path}: architectures {architectures} is not [{ARCHITECTURE!r}]"
        )
    refused = {
        "rope_scaling": raw.get("rope_scaling") not in (None, {}),
        "attention_bias": bool(raw.get("attention_bias", False)),
        "mlp_bias": bool(raw.get("mlp_bias", False)),
        "hidden_act": raw.get("hidden_act", "silu") != "silu",
    }
    for field, bad in refused.items():
        if bad:
            raise CheckpointError(f"{config_path}: {field}={raw.get(field)!r} is not supported")


def load_checkpoint(path: Path) -> Checkpoint:
    """Shape and weights (float32, on the CPU) of the checkpoint in `path`."""
    shape = read_shape(path)
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors file")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        for name, tensor in load_file(str(file)).items():
            weights[name.removeprefix("model.")] = tensor.to(torch.float32)
    if shape.tie_word_embeddings and "embed_tokens.weight" in weights:
        weights.setdefault("lm_head.weight", weights["embed_tokens.weight"])
    missing = [name for name in _required(shape) if name not in weights]
    if missing:
        raise CheckpointError(f"{path}: weights missing: {', '.join(missing[:5])}")
    return Checkpoint(path, shape, weights)


def _required(shape: LlamaShape) -> list[str]:
    per_layer = (
        "input_layernorm.weight",
        "post_attention_layernorm.weight",
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
    )
    names = ["embed_tokens.weight", "norm.weight", "lm_head.weight"]
    for layer in range(shape.num_layers):
        names += [f"layers.{layer}.{name}" for name in per_layer]
    return names
