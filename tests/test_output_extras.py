"""Merging what engines return besides text: tool-call deltas join by index with their
argument fragments concatenated; log-probability lists concatenate; nothing is lost or
invented."""

from __future__ import annotations

from qlm.output_extras import final_tool_calls, merge_extras


def test_tool_call_deltas_merge_by_index() -> None:
    head = {"index": 0, "id": "c0", "type": "function", "function": {"name": "f", "arguments": ""}}
    second = {"index": 1, "id": "c1", "type": "function", "function": {"name": "g"}}
    merged = None
    for delta in (
        {"tool_calls": [head]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a":'}}]},
        {"tool_calls": [second, {"index": 0, "function": {"arguments": " 1}"}}]},
        {"tool_calls": [{"index": 1, "function": {"arguments": "{}"}}]},
    ):
        merged = merge_extras(merged, delta)
    assert final_tool_calls(merged) == [
        {"id": "c0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
        {"id": "c1", "type": "function", "function": {"name": "g", "arguments": "{}"}},
    ]


def test_logprob_lists_concatenate_without_sharing_the_inputs() -> None:
    first = {"logprobs": {"content": [{"token": "a"}]}}
    merged = merge_extras(None, first)
    merged = merge_extras(merged, {"logprobs": {"content": [{"token": "b"}]}})
    assert merged == {"logprobs": {"content": [{"token": "a"}, {"token": "b"}]}}
    assert first == {"logprobs": {"content": [{"token": "a"}]}}  # the accumulator owns its list
    tokens = merge_extras({"logprobs": {"tokens": ["x"], "token_logprobs": [-1.0]}}, None)
    assert tokens == {"logprobs": {"tokens": ["x"], "token_logprobs": [-1.0]}}


def test_nothing_merges_to_nothing() -> None:
    assert merge_extras(None, None) is None
    assert merge_extras(None, {}) is None
    assert merge_extras(None, {"logprobs": None}) is None
    assert final_tool_calls(None) is None
