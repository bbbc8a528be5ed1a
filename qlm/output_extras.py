"""What an engine returns besides text, kept as OpenAI shapes it: tool calls and log
probabilities. Engines that honour `tools` or `logprobs` (vLLM) report them per streamed
chunk; the agent merges a round's chunks into one stream event and a request's chunks into
its result (`merge_extras` accumulates in place), and the API hands them to the client
unchanged (streamed deltas or the final message). Pure.

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


def merge_extras(into: Extras | None, more: Mapping[str, Any] | None) -> Extras | None:
    """Add `more` to the accumulator `into`, which is extended in place and returned (None
    starts a new one; None comes back while both are empty). `more` is neither changed nor
    shared: an accumulator owns its lists, so a long output merges in linear time."""
    if not more:
        return into
    out: Extras = {} if into is None else into
    for key, value in more.items():
        if value is None:
            continue
        if key == "tool_calls":
            _add_calls(out.setdefault(key, []), value)
        elif key == "logprobs":
            _add_lists(out.setdefault(key, {}), value)
        else:
            out[key] = value
    return out or None


def final_tool_calls(extras: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    """The merged tool calls as a chat message lists them (no stream `index`)."""
    calls = (extras or {}).get("tool_calls")
    if not calls:
        return None
    return [{k: v for k, v in call.items() if k != "index"} for call in calls]


def _add_calls(calls: list[dict[str, Any]], deltas: Sequence[Mapping[str, Any]]) -> None:
    by_index = {call["index"]: call for call in calls}
    for delta in deltas:
        index = int(delta.get("index", 0))
        call = by_index.get(index)
        if call is None:
            call = by_index[index] = {"index": index}
            calls.append(call)
        for key, value in delta.items():
            if key == "function" and isinstance(value, Mapping):
                _add_function(call.setdefault(key, {}), value)
            elif key != "index" and value is not None:
                call[key] = value
    calls.sort(key=lambda call: call["index"])


def _add_function(function: dict[str, Any], delta: Mapping[str, Any]) -> None:
    for key, value in delta.items():
        if key == "arguments":
            function[key] = str(function.get(key) or "") + str(value or "")
        elif value is not None:
            function[key] = value


def _add_lists(into: dict[str, Any], more: Mapping[str, Any]) -> None:
    for key, value in more.items():
        if isinstance(value, list):
            into.setdefault(key, []).extend(value)
        elif value is not None:
            into[key] = value
