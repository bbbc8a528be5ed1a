"""Prompt token counting for admission: the queue plans with token counts, and the API must
produce them without a model's tokenizer at hand.

A `TokenCounter` answers "how many tokens is this text?". Counters are registered by name and
chosen in `ApiConfig.token_counter`; a real tokenizer can be passed to `create_app` instead.
The built-in ones are deterministic approximations, cheap enough for the admission path.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from qlm.registry import Registry


class TokenCounter(Protocol):
    def count(self, text: str) -> int:
        """Tokens in `text`; at least 1 for the empty string (the prompt's start token)."""
        ...


class Utf8BytesCounter:
    """ceil(UTF-8 bytes / 4): close to BPE tokenizers on English text, never zero."""

    def count(self, text: str) -> int:
        num_bytes = len(text) if text.isascii() else len(text.encode("utf-8"))
        return max(1, -(-num_bytes // 4))


class WhitespaceCounter:
    """Whitespace-separated words; undercounts code and non-Latin scripts."""

    def count(self, text: str) -> int:
        return max(1, len(text.split()))


TOKEN_COUNTERS: Registry[TokenCounter] = Registry("token counter")
TOKEN_COUNTERS.register("utf8-bytes")(Utf8BytesCounter)
TOKEN_COUNTERS.register("whitespace")(WhitespaceCounter)


def make_token_counter(name: str) -> TokenCounter:
    return TOKEN_COUNTERS.create(name)


def flatten_chat(messages: Iterable[tuple[str, str]]) -> str:
    """One prompt from (role, content) pairs: each message as `<|role|>\\ncontent\\n`, then
    `<|assistant|>\\n` to open the reply. Engines that apply their own chat template get the
    messages from this text by the same tags."""
    parts = [f"<|{role}|>\n{content}\n" for role, content in messages]
    parts.append("<|assistant|>\n")
    return "".join(parts)
