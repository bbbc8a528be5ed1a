"""How long are a stream's prompts and outputs?

Three sources: ``fixed`` lengths, ``trace`` (rows drawn with replacement from a trace, prompt
and output together, optionally only prompts within bounds) and ``replay`` (the replayed trace
rows' own lengths, in order; trace arrivals only). Output lengths may be capped.
"""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from qlm.config import StrictModel
from qlm.sim.traces import Trace, load_trace
from qlm.sim.workload.arrivals import TraceArrivals, trace_rows
from qlm.sim.workload.paths import TraceFormat, TracePath

IntArray = npt.NDArray[np.int64]


class TraceLengths(StrictModel):
    """Prompt and output lengths drawn jointly (one row at a time, with replacement) from a
    trace's rows, optionally restricted to prompts in [min_prompt_tokens, max_prompt_tokens]."""

    source: Literal["trace"]
    path: TracePath
    format: TraceFormat = "azure"
    min_prompt_tokens: int | None = Field(default=None, ge=1)
    max_prompt_tokens: int | None = Field(default=None, ge=1)
    max_output_tokens: int | None = Field(default=None, ge=1, description="Cap (clip).")


class FixedLengths(StrictModel):
    source: Literal["fixed"]
    prompt_tokens: int = Field(ge=1)
    output_tokens: int = Field(ge=1)


class ReplayLengths(StrictModel):
    """The replayed trace rows' own lengths (trace arrivals only)."""

    source: Literal["replay"]
    max_output_tokens: int | None = Field(default=None, ge=1, description="Cap (clip).")


Lengths = Annotated[TraceLengths | FixedLengths | ReplayLengths, Field(discriminator="source")]


class LengthSampler:
    """Draws (prompt, output) lengths for one stream from its own generator. `replayed` is
    the stream's trace arrivals, whose rows a ``replay`` source reads."""

    def __init__(
        self,
        lengths: TraceLengths | FixedLengths | ReplayLengths,
        rng: np.random.Generator,
        replayed: TraceArrivals | None,
    ) -> None:
        self.lengths = lengths
        self.rng = rng
        self.next_row = 0
        self.rows: Trace | None = None
        self.last_rows: IntArray | None = None  # the rows the last draw took (trace sources)
        if isinstance(lengths, TraceLengths):
            trace = load_trace(lengths.path, lengths.format)
            self.rows = trace.where_prompt(lengths.min_prompt_tokens, lengths.max_prompt_tokens)
        elif isinstance(lengths, ReplayLengths):
            assert replayed is not None, "replay lengths need trace arrivals"
            self.rows, self.next_row = trace_rows(replayed)

    def draw(self, n: int) -> tuple[IntArray, IntArray]:
        lengths = self.lengths
        if isinstance(lengths, FixedLengths):
            return (
                np.full(n, lengths.prompt_tokens, dtype=np.int64),
                np.full(n, lengths.output_tokens, dtype=np.int64),
            )
        assert self.rows is not None
        if isinstance(lengths, ReplayLengths):
            idx = np.arange(self.next_row, self.next_row + n)
            self.next_row += n
            self.last_rows = idx
        else:
            idx = self.rng.integers(0, len(self.rows), n)
        self.last_rows = idx.astype(np.int64)
        prompts, outputs = self.rows.prompt_tokens[idx], self.rows.output_tokens[idx]
        cap = lengths.max_output_tokens
        return prompts, (np.minimum(outputs, cap) if cap is not None else outputs)
