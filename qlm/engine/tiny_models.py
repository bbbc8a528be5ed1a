"""Tiny Llama models with random weights, built on the spot, for a real vLLM engine on a CPU.

No weights can be downloaded here, so tests and baselines serve a 2-layer Llama whose weights
are random and whose tokenizer is a byte-level BPE trained on a small synthetic corpus. The
output is nonsense; the serving path (tokenising, prefill, decode, streaming, KV cache) is real.

This module runs inside the vLLM environment (`.venv-vllm`), which lacks qlm's dependencies:
it imports only the standard library at module level and loads `torch`, `transformers` and
`tokenizers` inside functions. Run it as

    .venv-vllm/bin/python -m qlm.engine.tiny_models OUT_DIR --seed 1 [--hidden-size 128]

Two seeds (or sizes) stand in for two different models ("tiny-a", "tiny-b"). vLLM's CPU
attention refuses small heads (head_dim 16 fails), so keep hidden_size / num_heads >= 64.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")
MIN_HEAD_DIM = 64
_VOCABULARY = (
    "the queue model plans request group engine token batch slot deadline serve load swap "
    "prefill decode cache memory latency throughput instance fleet class interactive schedule "
    "evict pull wait time first last order early late fast slow small large tiny"
)


@dataclass(frozen=True, slots=True)
class TinyLlamaConfig:
    """The shape of one tiny Llama; written next to the weights as qlm_tiny_model.json."""

    seed: int
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 2
    vocab_size: int = 512
    max_position_embeddings: int = 32768

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError("hidden_size must be a multiple of num_heads")
        if self.head_dim < MIN_HEAD_DIM:
            raise ValueError(
                f"head_dim {self.head_dim} < {MIN_HEAD_DIM}: vLLM's CPU attention refuses it"
            )
        if self.vocab_size < 256 + len(SPECIAL_TOKENS):
            raise ValueError("vocab_size must cover the 256 byte-level symbols and specials")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def _module(name: str) -> Any:
    """Import a heavy library lazily (it exists only in the vLLM environment)."""
    return importlib.import_module(name)


def synthetic_corpus(seed: int, num_lines: int = 2000) -> Iterator[str]:
    """Deterministic word salad with digits and punctuation for the BPE trainer."""
    rng = random.Random(seed)
    vocabulary = _VOCABULARY.split()
    for i in range(num_lines):
        words = rng.choices(vocabulary, k=rng.randint(4, 16))
        yield f"{' '.join(words)} {i} {rng.randint(0, 9999)}."


# A plain chat template ("role: content" lines), so chat requests can use the model's own
# template through vLLM's chat endpoint like a real instruction-tuned model's.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: "
    "{% if m['content'] is string %}{{ m['content'] }}{% endif %}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def train_tokenizer(spec: TinyLlamaConfig) -> Any:
    """A byte-level BPE (any text encodes; no unknown tokens) wrapped for transformers."""
    tokenizers = _module("tokenizers")
    transformers = _module("transformers")
    tok = tokenizers.Tokenizer(tokenizers.models.BPE())
    tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(synthetic_corpus(spec.seed), trainer=trainer)
    bos, eos, pad = SPECIAL_TOKENS
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, pad_token=pad
    )


def _llama_config(spec: TinyLlamaConfig, tokenizer: Any) -> Any:
    transformers = _module("transformers")
    return transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.hidden_size * 2,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )


def build_tiny_llama(
    out_dir: str | Path,
    *,
    seed: int,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 2,
    vocab_size: int = 512,
    max_position_embeddings: int = 32768,
) -> Path:
    """Write a Hugging Face model folder (config, safetensors, tokenizer) and return its path.

    Deterministic in `seed`: the same arguments give the same weights and tokenizer.
    """
    spec = TinyLlamaConfig(
        seed, hidden_size, num_layers, num_heads, vocab_size, max_position_embeddings
    )
    torch = _module("torch")
    transformers = _module("transformers")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = train_tokenizer(spec)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(_llama_config(spec, tokenizer))
    model = model.to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    (out / "qlm_tiny_model.json").write_text(json.dumps(asdict(spec), indent=2) + "\n")
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build a tiny random-weight Llama folder.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=512)
    parser.add_argument("--max-position-embeddings", type=int, default=32768)
    args = parser.parse_args(argv)
    path = build_tiny_llama(
        args.out_dir,
        seed=args.seed,
        hidden_size=args.hidden_size,
        num_layers=args.num_layers,
        num_heads=args.num_heads,
        vocab_size=args.vocab_size,
        max_position_embeddings=args.max_position_embeddings,
    )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
