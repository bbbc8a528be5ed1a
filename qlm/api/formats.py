"""OpenAI's two generation endpoints as data: the body each accepts, how its prompt becomes
one text, and the shapes of its responses and stream chunks. The handlers are written once
over `OutputFormat`; `CHAT` and `COMPLETION` are its two values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from qlm.api.schemas import Body, ChatBody, CompletionBody
from qlm.output_extras import Extras, final_tool_calls

Json = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Head:
    """What every response of one request repeats."""

    id: str
    created: int
    model: str


def usage(prompt_tokens: int, completion_tokens: int) -> Json:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


class OutputFormat(Protocol):
    kind: str
    id_prefix: str

    def parse(self, raw: str) -> Body:
        """The body validated from JSON text; pydantic.ValidationError if invalid."""
        ...

    def response(
        self, head: Head, text: str, finish_reason: str, usage: Json, extras: Extras | None
    ) -> Json: ...
    def first_chunk(self, head: Head) -> Json | None: ...
    def chunk(self, head: Head, text: str, extras: Extras | None) -> Json: ...
    def final_chunk(self, head: Head, finish_reason: str) -> Json: ...
    def usage_chunk(self, head: Head, usage: Json) -> Json: ...


class CompletionFormat:
    kind = "completion"
    id_prefix = "cmpl-"

    def parse(self, raw: str) -> Body:
        return CompletionBody.model_validate_json(raw)

    def _envelope(self, head: Head, choices: list[Json]) -> Json:
        return {
            "id": head.id,
            "object": "text_completion",
            "created": head.created,
            "model": head.model,
            "choices": choices,
        }

    def _choice(self, text: str, finish_reason: str | None, extras: Extras | None = None) -> Json:
        logprobs = (extras or {}).get("logprobs")
        return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish_reason}

    def response(
        self, head: Head, text: str, finish_reason: str, usage: Json, extras: Extras | None
    ) -> Json:
        choice = self._choice(text, finish_reason, extras)
        return {**self._envelope(head, [choice]), "usage": usage}

    def first_chunk(self, head: Head) -> Json | None:
        return None

    def chunk(self, head: Head, text: str, extras: Extras | None) -> Json:
        return self._envelope(head, [self._choice(text, None, extras)])

    def final_chunk(self, head: Head, finish_reason: str) -> Json:
        return self._envelope(head, [self._choice("", finish_reason)])

    def usage_chunk(self, head: Head, usage: Json) -> Json:
        return {**self._envelope(head, []), "usage": usage}


class ChatFormat:
    kind = "chat"
    id_prefix = "chatcmpl-"

    def parse(self, raw: str) -> Body:
        return ChatBody.model_validate_json(raw)

    def _envelope(self, head: Head, obj: str, choices: list[Json]) -> Json:
        return {
            "id": head.id,
            "object": obj,
            "created": head.created,
            "model": head.model,
            "choices": choices,
        }

    def _delta(self, delta: Json, finish_reason: str | None, logprobs: Any = None) -> Json:
        return {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}

    def response(
        self, head: Head, text: str, finish_reason: str, usage: Json, extras: Extras | None
    ) -> Json:
        message: Json = {"role": "assistant", "content": text}
        calls = final_tool_calls(extras)
        if calls:
            message["tool_calls"] = calls
        choice = {
            "index": 0,
            "message": message,
            "logprobs": (extras or {}).get("logprobs"),
            "finish_reason": finish_reason,
        }
        return {**self._envelope(head, "chat.completion", [choice]), "usage": usage}

    def first_chunk(self, head: Head) -> Json | None:
        delta = self._delta({"role": "assistant", "content": ""}, None)
        return self._envelope(head, "chat.completion.chunk", [delta])

    def chunk(self, head: Head, text: str, extras: Extras | None) -> Json:
        extras = extras or {}
        delta: Json = {"content": text} if text or not extras.get("tool_calls") else {}
        if extras.get("tool_calls"):
            delta["tool_calls"] = extras["tool_calls"]  # stream deltas, with their index
        choice = self._delta(delta, None, extras.get("logprobs"))
        return self._envelope(head, "chat.completion.chunk", [choice])

    def final_chunk(self, head: Head, finish_reason: str) -> Json:
        return self._envelope(head, "chat.completion.chunk", [self._delta({}, finish_reason)])

    def usage_chunk(self, head: Head, usage: Json) -> Json:
        return {**self._envelope(head, "chat.completion.chunk", []), "usage": usage}


COMPLETION = CompletionFormat()
CHAT = ChatFormat()
FORMATS: dict[str, OutputFormat] = {COMPLETION.kind: COMPLETION, CHAT.kind: CHAT}
