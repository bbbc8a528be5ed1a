"""The three applications of the programs benchmark, each built as a `ProgramBuilder` (the body
of one program) from arXiv summarisation lengths (sims/data, NOTICE there): a chain that
summarises a document chunk by chunk, each step carrying the summary so far; a map-reduce
that summarises the chunks at once and merges the summaries; and two agents that answer each
other for a few turns. Prompt text is sized to the API's token counter (4 ASCII characters a
token)."""

from __future__ import annotations

import csv
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from qlm.programs.python_client import ProgramBuilder

ROOT = Path(__file__).resolve().parent.parent.parent
LENGTHS = ROOT / "sims" / "data" / "arxiv_summarization_lengths.csv"
CHUNK_TOKENS = 1_024
MAX_CHUNKS = 6
STEP_OUTPUT_TOKENS = 64  # a chunk's summary
MERGE_OUTPUT_CAP = 256  # the final summary: the trace's output length, capped
TURNS = 6  # multi-agent: three turns each
TURN_OUTPUT_TOKENS = 48
TOPIC_TOKENS = 512


@dataclass(frozen=True, slots=True)
class Document:
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class App:
    kind: str
    program: ProgramBuilder
    result: str  # the variable that ends it


def documents(seed: int) -> list[Document]:
    """The trace's documents in a seeded order (those of at least two chunks)."""
    with LENGTHS.open() as f:
        rows = [Document(int(r["num_prefill_tokens"]), int(r["num_decode_tokens"]))
                for r in csv.DictReader(f)]  # fmt: skip
    rows = [d for d in rows if d.prompt_tokens >= 2 * CHUNK_TOKENS]
    random.Random(seed).shuffle(rows)
    return rows


def text(tokens: int, word: str) -> str:
    """About `tokens` tokens of text (4 ASCII characters each)."""
    unit = f"{word} "
    return (unit * (4 * tokens // len(unit) + 1))[: 4 * tokens]


def chain(doc: Document, model: str, tag: str) -> App:
    p = ProgramBuilder(model, max_tokens=STEP_OUTPUT_TOKENS)
    chunks = min(MAX_CHUNKS, doc.prompt_tokens // CHUNK_TOKENS)
    summary = p.call(
        "s0", "Summarise this part of a paper. " + p.input("c0", text(CHUNK_TOKENS, tag))
    )
    for i in range(1, chunks):
        chunk = p.input(f"c{i}", text(CHUNK_TOKENS, f"{tag}{i}"))
        prompt = f"Summary so far: {summary}\nExtend it with this part of the paper. {chunk}"
        summary = p.call(f"s{i}", prompt)
    return App("chain", p, f"s{chunks - 1}")


def map_reduce(doc: Document, model: str, tag: str) -> App:
    p = ProgramBuilder(model, max_tokens=STEP_OUTPUT_TOKENS)
    chunks = min(MAX_CHUNKS, doc.prompt_tokens // CHUNK_TOKENS)
    parts = [
        p.call(
            f"s{i}",
            "Summarise this part of a paper. " + p.input(f"c{i}", text(CHUNK_TOKENS, f"{tag}{i}")),
        )
        for i in range(chunks)
    ]
    cap = max(STEP_OUTPUT_TOKENS, min(doc.output_tokens, MERGE_OUTPUT_CAP))
    p.call("merged", "Merge these summaries into one abstract. " + " ".join(parts), max_tokens=cap)
    return App("map-reduce", p, "merged")


def multi_agent(doc: Document, model: str, tag: str) -> App:
    p = ProgramBuilder(model, max_tokens=TURN_OUTPUT_TOKENS)
    last = p.input("topic", text(TOPIC_TOKENS, tag))
    for turn in range(TURNS):
        speaker = "the author" if turn % 2 == 0 else "the reviewer"
        last = p.call(f"t{turn}", f"You are {speaker}. Answer the last message briefly. {last}")
    return App("multi-agent", p, f"t{TURNS - 1}")


APPS: dict[str, Callable[[Document, str, str], App]] = {
    "chain": chain,
    "map-reduce": map_reduce,
    "multi-agent": multi_agent,
}
