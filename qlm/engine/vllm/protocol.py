"""vLLM's OpenAI endpoints on the wire: the request body QLM sends and the SSE it reads back.

Question answered: what does a streamed /v1/completions or /v1/chat/completions request look
like, and what does each line of its server-sent-event stream say (text or a chat delta's
content, plus tool calls and log probabilities kept as vLLM sent them)? Pure: no I/O. The
body asks for `stream: true` and continuous usage statistics, so token counts come from the
usage numbers, not from counting chunks. A request without prompt text sends `prompt_tokens`
synthetic token ids, so its prompt length is exact, and always runs to max_tokens
(`ignore_eos`). Under deadline scheduling (the default) a request's vLLM priority is its TTFT
deadline in ms, so the server starts what waits inside it earliest deadline first.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import dataclass
from typing import Any

from qlm.config.vllm_config import VllmEngineConfig
from qlm.engine.openai_fields import ENGINE_FIELDS
from qlm.types import Request

# Passed to vLLM as the client sent them (the API refused anything vLLM does not honour).
SAMPLING_FIELDS = frozenset({"temperature", "top_p", "stop", "seed", *ENGINE_FIELDS["vllm"]})
CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
INT64_MAX = 2**63 - 1  # vLLM's bound on a request's priority


def synthetic_prompt(request_id: str, num_tokens: int, token_ids: tuple[int, int]) -> list[int]:
    """num_tokens token ids, different per request (so the prefix cache does not share them)."""
    low, high = token_ids
    offset = zlib.crc32(request_id.encode())
    return [low + (offset + 7 * i) % (high - low) for i in range(num_tokens)]


def request_body(
    request: Request, max_tokens: int, config: VllmEngineConfig
) -> tuple[str, dict[str, Any]]:
    """(path, body): a chat request with its messages goes to the chat endpoint (the model's
    own template applies), everything else to completions."""
    seed = {"seed": zlib.crc32(request.id.encode())} if config.seed_requests else {}
    if request.messages is not None:
        source: dict[str, Any] = {"messages": request.messages}
        path = CHAT_PATH
    elif request.prompt is not None:
        source, path = {"prompt": request.prompt}, COMPLETIONS_PATH
    else:
        ids = synthetic_prompt(request.id, request.prompt_tokens, config.synthetic_token_ids)
        source, path = {"prompt": ids}, COMPLETIONS_PATH
    body = {
        **seed,  # the client's own seed, if any, wins
        **{k: v for k, v in request.sampling.items() if k in SAMPLING_FIELDS},
        "model": request.model,
        **source,
        "max_tokens": max_tokens,
        "stream": True,
        # synthetic prompts stand for a length, so they always run to max_tokens
        "ignore_eos": config.ignore_eos or request.prompt is None or request.ignores_eos,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if config.scheduling == "deadline":  # vLLM starts the lowest first
        body["priority"] = deadline_priority(request)
    return path, body


def deadline_priority(request: Request) -> int:
    """vLLM's priority for `request` under deadline scheduling: its TTFT deadline in ms,
    within vLLM's int64 (no deadline: last)."""
    deadline_ms = request.ttft_deadline_at_s * 1000
    if not math.isfinite(deadline_ms):
        return INT64_MAX if deadline_ms > 0 else -INT64_MAX
    return max(-INT64_MAX, min(INT64_MAX, math.floor(deadline_ms)))


class SseLines:
    """Splits a server-sent-event byte stream into lines at LF (a CR before it is dropped).

    Not str.splitlines, which also splits at U+0085, U+2028 and U+2029: JSON leaves those
    unescaped inside a token's text, and the JSON of such a chunk would break."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[str]:
        *lines, self._pending = (self._pending + data).split(b"\n")
        return [line.removesuffix(b"\r").decode() for line in lines]


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """One SSE chunk of a streamed completion."""

    text: str = ""
    completion_tokens: int | None = None  # cumulative, from the usage statistics
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None
    extras: dict[str, Any] | None = None  # tool calls, log probabilities (output_extras.py)


def parse_sse_line(line: str) -> StreamDelta | None:
    """A `data: {...}` line as a delta; None for blank lines, comments and `[DONE]`."""
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    if not data or data == "[DONE]":
        return None
    chunk = json.loads(data)
    if "error" in chunk:
        error = chunk["error"]
        return StreamDelta(
            error=str(error.get("message", error) if isinstance(error, dict) else error)
        )
    usage = chunk.get("usage") or {}
    choices = chunk.get("choices") or []
    choice = choices[0] if choices else {}
    delta = choice.get("delta") or {}  # chat chunks
    extras = {"tool_calls": delta.get("tool_calls"), "logprobs": choice.get("logprobs")}
    return StreamDelta(
        text=choice.get("text") or delta.get("content") or "",
        completion_tokens=usage.get("completion_tokens"),
        prompt_tokens=usage.get("prompt_tokens"),
        finish_reason=choice.get("finish_reason"),
        extras={k: v for k, v in extras.items() if v} or None,
    )
