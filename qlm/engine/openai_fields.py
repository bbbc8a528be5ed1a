"""Which OpenAI request fields each engine kind honours beyond QLM's own (model, prompt or
messages, max_tokens, stream, temperature, top_p, stop, seed, ignore_eos), and whether it
applies the model's own chat template. The API refuses a field the fleet's engine kind does
not list (400 naming the field and the kind); the engine receives the rest as the client sent
them and answers with OpenAI's shapes (qlm/output_extras.py).

    emulated: none; chat messages are flattened to text (the engine only counts tokens).
    vllm:     tools, tool_choice, parallel_tool_calls, response_format, logprobs,
              top_logprobs, presence_penalty, frequency_penalty, logit_bias; chat goes to
              vLLM's /v1/chat/completions with the messages as sent.
    native:   none; chat messages are flattened to text, tokenised with the checkpoint's
              tokenizer (qlm/engine/native: no chat template yet).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

# Every output field QLM knows, in the order errors name them.
OUTPUT_FIELDS = (
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "logprobs",
    "top_logprobs",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
)
ENGINE_FIELDS: Mapping[str, frozenset[str]] = MappingProxyType(
    {"emulated": frozenset(), "vllm": frozenset(OUTPUT_FIELDS), "native": frozenset()}
)
CHAT_TEMPLATE_ENGINES = frozenset({"vllm"})  # chat messages travel as sent


def unsupported(engine_kind: str, fields: Mapping[str, object]) -> str | None:
    """The first field of `fields` the engine kind does not honour; None when all are."""
    honoured = ENGINE_FIELDS.get(engine_kind, frozenset())
    return next((name for name in OUTPUT_FIELDS if name in fields and name not in honoured), None)
