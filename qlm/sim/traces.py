"""Trace files as columns: arrival times (seconds from the first row) and token lengths.

Formats, registered by name in TRACE_FORMATS:

* ``azure``: the Azure LLM inference trace 2023 (CSV: TIMESTAMP, ContextTokens,
  GeneratedTokens), e.g. ``AzureLLMInferenceTrace_conv.csv``;
* ``mooncake``: the Mooncake (Kimi) trace (JSON lines: timestamp in ms, input_length,
  output_length, hash_ids: one id per 512-token block of the prompt, equal ids for equal
  blocks), the ids kept per row (`Trace.blocks`);
* ``vidur``: Vidur's processed length traces (CSV: num_prefill_tokens, num_decode_tokens);
  lengths only, every arrival at 0.

A trace is read once per (path, modification time) and shared: it is immutable.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.typing as npt

from qlm.registry import Registry

MOONCAKE_BLOCK_TOKENS = 512  # the Mooncake traces' hash_ids name blocks of this many tokens
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


class TraceError(ValueError):
    """A trace file cannot be read or holds no usable rows; the message names the file."""


@dataclass(frozen=True)
class Trace:
    """Rows of a trace in arrival order. Token counts are at least 1."""

    name: str
    arrival_s: FloatArray  # seconds since the first row, non-decreasing
    prompt_tokens: IntArray
    output_tokens: IntArray
    has_timestamps: bool = True
    # Per row, the ids of its prompt's blocks (`block_tokens` each, the last one partial), for
    # traces that carry them (Mooncake); None otherwise.
    blocks: tuple[tuple[int, ...], ...] | None = None
    block_tokens: int = 0

    def __post_init__(self) -> None:
        n = len(self.arrival_s)
        if not (len(self.prompt_tokens) == len(self.output_tokens) == n):
            raise TraceError(f"{self.name}: columns differ in length")
        if self.blocks is not None and len(self.blocks) != n:
            raise TraceError(f"{self.name}: block ids differ in length from the rows")
        for column in (self.arrival_s, self.prompt_tokens, self.output_tokens):
            column.setflags(write=False)

    def __len__(self) -> int:
        return len(self.arrival_s)

    @property
    def duration_s(self) -> float:
        return float(self.arrival_s[-1]) if len(self) else 0.0

    def where_prompt(self, min_tokens: int | None, max_tokens: int | None) -> Trace:
        """The rows whose prompt length lies in [min_tokens, max_tokens] (None: unbounded)."""
        keep = np.ones(len(self), dtype=bool)
        if min_tokens is not None:
            keep &= self.prompt_tokens >= min_tokens
        if max_tokens is not None:
            keep &= self.prompt_tokens <= max_tokens
        if not keep.any():
            raise TraceError(
                f"{self.name}: no row has a prompt in [{min_tokens}, {max_tokens}] tokens"
            )
        blocks = None
        if self.blocks is not None:
            blocks = tuple(b for b, kept in zip(self.blocks, keep.tolist(), strict=True) if kept)
        return Trace(
            self.name,
            self.arrival_s[keep],
            self.prompt_tokens[keep],
            self.output_tokens[keep],
            self.has_timestamps,
            blocks,
            self.block_tokens,
        )


TraceReader = Callable[[Path], Trace]
TRACE_FORMATS: Registry[Trace] = Registry("trace format")


def load_trace(path: Path, fmt: str) -> Trace:
    """Read a trace in a registered format (cached by path and modification time)."""
    TRACE_FORMATS.get(fmt)  # unknown formats fail before any I/O, listing the known ones
    resolved = path.resolve()
    try:
        mtime_ns = resolved.stat().st_mtime_ns
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc}") from exc
    return _load_cached(str(resolved), mtime_ns, fmt)


@lru_cache(maxsize=16)
def _load_cached(path: str, mtime_ns: int, fmt: str) -> Trace:
    try:
        trace = TRACE_FORMATS.create(fmt, Path(path))
    except (OSError, UnicodeDecodeError, KeyError, ValueError) as exc:
        if isinstance(exc, TraceError):
            raise
        raise TraceError(f"{path}: not a {fmt} trace: {exc!r}") from exc
    if len(trace) == 0:
        raise TraceError(f"{path}: no rows")
    return trace


def _columns(
    name: str,
    times_s: list[float],
    prompts: list[int],
    outputs: list[int],
    stamped: bool,
    blocks: list[tuple[int, ...]] | None = None,
    block_tokens: int = 0,
) -> Trace:
    arrival = np.asarray(times_s, dtype=np.float64)
    order = np.argsort(arrival, kind="stable")
    arrival = arrival[order]
    if len(arrival):
        arrival = arrival - arrival[0]
    return Trace(
        name,
        arrival,
        np.maximum(1, np.asarray(prompts, dtype=np.int64)[order]),
        np.maximum(1, np.asarray(outputs, dtype=np.int64)[order]),
        stamped,
        None if blocks is None else tuple(blocks[i] for i in order.tolist()),
        block_tokens,
    )


@TRACE_FORMATS.register("azure")
def read_azure_csv(path: Path) -> Trace:
    """Azure LLM inference trace 2023: TIMESTAMP (e.g. 2023-11-16 18:15:46.6805900),
    ContextTokens, GeneratedTokens."""
    stamps: list[str] = []
    prompts: list[int] = []
    outputs: list[int] = []
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            stamps.append(row["TIMESTAMP"].strip().replace(" ", "T"))
            prompts.append(int(row["ContextTokens"]))
            outputs.append(int(row["GeneratedTokens"]))
    ns = np.array(stamps, dtype="datetime64[ns]").astype(np.int64)
    times = ((ns - ns.min()) / 1e9).tolist() if len(ns) else []
    return _columns(path.name, times, prompts, outputs, stamped=True)


@TRACE_FORMATS.register("mooncake")
def read_mooncake_jsonl(path: Path) -> Trace:
    """Mooncake trace: one JSON object per line with timestamp (ms), input_length,
    output_length and hash_ids (one per 512-token block; optional)."""
    times: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    blocks: list[tuple[int, ...]] = []
    with path.open(encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            times.append(float(row["timestamp"]) / 1000.0)
            prompts.append(int(row["input_length"]))
            outputs.append(int(row["output_length"]))
            blocks.append(tuple(int(i) for i in row.get("hash_ids", ())))
    return _columns(path.name, times, prompts, outputs, True, blocks, MOONCAKE_BLOCK_TOKENS)


@TRACE_FORMATS.register("vidur")
def read_vidur_lengths(path: Path) -> Trace:
    """Vidur processed length trace: num_prefill_tokens, num_decode_tokens (no times)."""
    prompts: list[int] = []
    outputs: list[int] = []
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            prompts.append(int(row["num_prefill_tokens"]))
            outputs.append(int(row["num_decode_tokens"]))
    return _columns(path.name, [0.0] * len(prompts), prompts, outputs, stamped=False)
