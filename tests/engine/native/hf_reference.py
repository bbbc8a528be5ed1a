"""Hugging Face's answer for the native engine's tests; runs in the vLLM environment
(.venv-vllm has transformers), not under pytest:

    .venv-vllm/bin/python tests/engine/native/hf_reference.py OUT_DIR SPEC_JSON CASES_JSON

Builds a random-weight Llama of the given shape (seeded) with transformers, saves it to
OUT_DIR/model (safetensors), and writes OUT_DIR/reference.pt: for each case (prompt token ids,
tokens to generate) the float32 logits at every prompt position and the greedy continuation
with its logits at every step (end-of-sequence not honoured).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def build(spec: dict[str, Any], out: Path) -> Any:
    import torch
    import transformers

    torch.manual_seed(spec["seed"])
    config = transformers.LlamaConfig(
        vocab_size=spec["vocab_size"],
        hidden_size=spec["hidden_size"],
        intermediate_size=spec["hidden_size"] * 2,
        num_hidden_layers=spec["num_layers"],
        num_attention_heads=spec["num_heads"],
        num_key_value_heads=spec["num_kv_heads"],
        max_position_embeddings=4096,
        rope_theta=spec.get("rope_theta", 10000.0),
        tie_word_embeddings=spec.get("tie_word_embeddings", False),
        bos_token_id=0,
        eos_token_id=1,
        torch_dtype="float32",
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # larger weights than the default init: logits that differ
        for param in model.parameters():
            param.mul_(spec.get("weight_scale", 8.0))
    model.save_pretrained(out / "model", safe_serialization=True)
    return model


def run_case(model: Any, prompt: list[int], generate: int) -> dict[str, Any]:
    import torch

    with torch.no_grad():
        ids = torch.tensor([prompt])
        prompt_logits = model(ids).logits[0].float()
        tokens, step_logits = [], []
        for _ in range(generate):
            logits = model(ids).logits[0, -1].float()
            token = int(torch.argmax(logits))
            tokens.append(token)
            step_logits.append(logits)
            ids = torch.cat([ids, torch.tensor([[token]])], dim=1)
    stacked = torch.stack(step_logits) if step_logits else torch.zeros(0)
    return {"prompt_logits": prompt_logits, "tokens": tokens, "step_logits": stacked}


def main(argv: list[str]) -> int:
    import torch

    out, spec, cases = Path(argv[0]), json.loads(argv[1]), json.loads(argv[2])
    model = build(spec, out)
    results = [run_case(model, case["prompt"], case["generate"]) for case in cases]
    torch.save(results, out / "reference.pt")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
