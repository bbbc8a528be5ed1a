"""The three applications of the programs benchmark, each built as a `ProgramBuilder` (the body
of one program) from arXiv summarisation lengths (sims/data, NOTICE there), sharing context
across calls the way Parrot's applications do: a chain whose every step reads the paper and
extends the summary so far by one part; a map-reduce whose every map call reads the paper and
summarises one part, then a merge of the summaries; and two agents whose every turn reads the
topic and the whole conversation so far. Prompt text is sized to the API's token counter (4
ASCII characters a token)."""

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


def paper(doc: Document, tag: str) -> str:
    """The paper every call of an app reads: its first chunks, MAX_CHUNKS at most."""
    chunks = min(MAX_CHUNKS, doc.prompt_tokens // CHUNK_TOKENS)
    return " ".join(text(CHUNK_TOKENS, f"{tag}{i}") for i in range(chunks))


def parts(doc: Document) -> int:
    return min(MAX_CHUNKS, doc.prompt_tokens // CHUNK_TOKENS)


def chain(doc: Document, model: str, tag: str) -> App:
    """Each step reads the whole paper, then the summary so far, and extends it with the next
    part (Parrot's chain summary: the paper is the context every step shares)."""
    p = ProgramBuilder(model, max_tokens=STEP_OUTPUT_TOKENS)
    paper_text = p.input("paper", paper(doc, tag))
    summary = p.call("s0", f"{paper_text}\nSummarise part 1 of the paper above.")
    for i in range(1, parts(doc)):
        prompt = f"{paper_text}\nSummary so far: {summary}\nExtend it with part {i + 1}."
        summary = p.call(f"s{i}", prompt)
    return App("chain", p, f"s{parts(doc) - 1}")


def map_reduce(doc: Document, model: str, tag: str) -> App:
    """Every map call reads the whole paper and summarises one part; the merge reads the
    summaries (Parrot's map-reduce: the paper is the context the maps share)."""
    p = ProgramBuilder(model, max_tokens=STEP_OUTPUT_TOKENS)
    paper_text = p.input("paper", paper(doc, tag))
    summaries = [
        p.call(f"s{i}", f"{paper_text}\nSummarise part {i + 1} of the paper above.")
        for i in range(parts(doc))
    ]
    cap = max(STEP_OUTPUT_TOKENS, min(doc.output_tokens, MERGE_OUTPUT_CAP))
    merge = "Merge these summaries into one abstract. " + " ".join(summaries)
    p.call("merged", merge, max_tokens=cap)
    return App("map-reduce", p, "merged")


def multi_agent(doc: Document, model: str, tag: str) -> App:
    """Two agents answer each other; each turn reads the topic and the whole conversation so
    far (Parrot's multi-agent chat: each turn's context is the last one's, extended)."""
    p = ProgramBuilder(model, max_tokens=TURN_OUTPUT_TOKENS)
    history = p.input("topic", text(TOPIC_TOKENS, tag)) + "\n"
    for turn in range(TURNS):
        speaker = "the author" if turn % 2 == 0 else "the reviewer"
        answer = p.call(f"t{turn}", f"{history}You are {speaker}. Answer the last message briefly.")
        history += f"{speaker}: {answer}\n"
    return App("multi-agent", p, f"t{TURNS - 1}")


APPS: dict[str, Callable[[Document, str, str], App]] = {
    "chain": chain,
    "map-reduce": map_reduce,
    "multi-agent": multi_agent,
}
