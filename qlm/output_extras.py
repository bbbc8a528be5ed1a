"""What an engine returns besides text, kept as OpenAI shapes it: tool calls and log
probabilities. Engines that honour `tools` or `logprobs` (vLLM) report them per streamed
chunk; the agent merges a round's chunks into one stream event and a request's chunks into
its result, and the API hands them to the client unchanged (streamed deltas or the final
message). Pure.

An extras mapping has at most these keys:

* `tool_calls`: chat tool calls as OpenAI's stream deltas give them (`index`, `id`, `type`,
  `function: {name, arguments}`); merging joins the deltas of one index, concatenating the
  `arguments` fragments;
* `logprobs`: the choice's log probabilities (chat: `{"content": [...]}`; completions:
  `{"tokens": [...], "token_logprobs": [...], ...}`); merging concatenates each list.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Extras = dict[str, Any]
KEYS = ("tool_calls", "logprobs")


def merge_extras(into: Mapping[str, Any] | None, more: Mapping[str, Any] | None) -> Extras | None:
    """`into` followed by `more`; None when both are empty."""
    if not more:
        return dict(into) if into else None
    out: Extras = dict(into or {})
    for key, value in more.items():
        if value is None:
            continue
        if key == "tool_calls":
            out[key] = _merge_calls(out.get(key) or [], value)
        elif key == "logprobs":
            out[key] = _concat_lists(out.get(key) or {}, value)
        else:
            out[key] = value
    return out or None


def final_tool_calls(extras: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """The merged tool calls as a chat message lists them (no stream `index`)."""
    calls = (extras or {}).get("tool_calls")
    if not calls:
        return None
    return [{k: v for k, v in call.items() if k != "index"} for call in calls]


def _merge_calls(calls: Sequence[Mapping[str, Any]], deltas: Sequence[Any]) -> list[Any]:
    by_index: dict[int, dict[str, Any]] = {int(c.get("index", 0)): dict(c) for c in calls}
    for delta in deltas:
        index = int(delta.get("index", 0))
        call = by_index.setdefault(index, {"index": index})
        for key, value in delta.items():
            if key == "function" and isinstance(value, Mapping):
                call[key] = _merge_function(call.get(key) or {}, value)
            elif value is not None:
                call[key] = value
    return [by_index[i] for i in sorted(by_index)]


def _merge_function(into: Mapping[str, Any], delta: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(into)
    for key, value in delta.items():
        if key == "arguments":
            out[key] = str(out.get(key) or "") + str(value or "")
        elif value is not None:
            out[key] = value
    return out


def _concat_lists(into: Mapping[str, Any], more: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(into)
    for key, value in more.items():
        if isinstance(value, list):
            out[key] = [*(out.get(key) or []), *value]
        elif value is not None:
            out[key] = value
    return out
