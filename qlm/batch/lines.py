"""The lines of a batch input file: OpenAI's JSONL format, one request per line,

    {"custom_id": "q-1", "method": "POST", "url": "/v1/chat/completions", "body": {...}}

checked line by line. A line that is not a JSON object, lacks a field, repeats a custom_id or
names another endpoint than the job's is reported with its line number (1-based, blank lines
count) and the rest go on; input in which no line is JSON at all is not JSONL and refuses the
whole job (`NotJsonlError`). The body itself is checked when the line is admitted, as a request
sent to `url` would be.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from qlm.batch.jobs import LineError

ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
MAX_LINES = 50_000  # OpenAI's limit per batch


class NotJsonlError(ValueError):
    """The input is not JSONL at all: the job fails whole."""


@dataclass(frozen=True, slots=True)
class InputLine:
    line: int
    custom_id: str
    body: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ParsedInput:
    lines: tuple[InputLine, ...]
    errors: tuple[LineError, ...]
    total: int  # non-blank lines


def parse_input(content: bytes, endpoint: str, max_lines: int = MAX_LINES) -> ParsedInput:
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise NotJsonlError(f"the input file is not UTF-8 (byte {exc.start})") from None
    lines: list[InputLine] = []
    errors: list[LineError] = []
    seen: set[str] = set()
    total = json_lines = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        total += 1
        if total > max_lines:
            raise NotJsonlError(f"the input has more than {max_lines} lines")
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            errors.append(LineError(number, "invalid_json", f"not JSON: {exc.msg}"))
            continue
        json_lines += 1
        checked = _check(number, data, endpoint, seen)
        (lines if isinstance(checked, InputLine) else errors).append(checked)  # type: ignore[arg-type]
    if total == 0:
        raise NotJsonlError("the input file has no lines")
    if json_lines == 0:
        raise NotJsonlError("no line of the input file is JSON: it is not JSONL")
    return ParsedInput(tuple(lines), tuple(errors), total)


def _check(number: int, data: object, endpoint: str, seen: set[str]) -> InputLine | LineError:
    if not isinstance(data, dict):
        return LineError(number, "invalid_request", "a line must be a JSON object")
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError(number, "invalid_request", "custom_id must be a non-empty string",
                         "custom_id")  # fmt: skip
    if custom_id in seen:
        return LineError(number, "duplicate_custom_id",
                         f"custom_id {custom_id!r} is used by an earlier line", "custom_id",
                         custom_id)  # fmt: skip
    seen.add(custom_id)
    if data.get("method", "POST") != "POST":
        return LineError(number, "invalid_request", "method must be POST", "method", custom_id)
    if data.get("url") != endpoint:
        message = f"url must be the batch's endpoint {endpoint!r}, not {data.get('url')!r}"
        return LineError(number, "invalid_url", message, "url", custom_id)
    body = data.get("body")
    if not isinstance(body, dict):
        return LineError(number, "invalid_request", "body must be a JSON object", "body",
                         custom_id)  # fmt: skip
    if body.get("stream"):
        return LineError(number, "invalid_request", "batch lines do not stream", "body.stream",
                         custom_id)  # fmt: skip
    return InputLine(number, custom_id, body)
