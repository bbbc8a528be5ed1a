"""Shared-prefix attention benchmark: one decode step's attention for a batch whose sequences
share a prefix, read once for the batch (qlm/engine/native/attention.py) against each
sequence reading its whole context from the paged cache (the per-sequence path).

    .venv/bin/python -m benchmarks.shared_prefix            # the grid below, CPU
    .venv/bin/python -m benchmarks.shared_prefix --quick    # prefix 2,048 x batch 16 only

Both paths read K and V from one paged cache ([slots, kv heads, dim], blocks of 16 token
slots) through slot indexes, as the native engine does; each sequence has 32 tokens of its own
after the prefix and decodes one token. Shape of one attention layer of a small Llama: 16
query heads, 4 KV heads, head dim 64, float32. The per-sequence path is the faster of torch's
scaled_dot_product_attention per sequence, the engine's own `attend` per sequence, and all
sequences in one padded batch (`attend_padded` over whole contexts: no Python loop, but the
prefix read once per sequence), for each point. Times: the median of
repeated steps after a warm-up, in one process, on this machine's torch CPU threads.

Writes benchmarks/results/shared_prefix.json and the "shared-prefix" block of
docs/benchmarks.md. The Triton kernel on a GPU: benchmarks/shared_prefix_gpu.py.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common.tables import markdown_table, target_row
from benchmarks.report import (
    RESULTS_DIR,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from qlm.engine.native.attention import attend, attend_padded, shared_prefix_attention

RESULTS_PATH = RESULTS_DIR / "shared_prefix.json"
PREFIXES = (256, 1024, 2048, 4096)
BATCHES = (1, 4, 16, 64)
HEADS, KV_HEADS, DIM = 16, 4, 64
BLOCK = 16
OWN_TOKENS = 32
TARGET = (2048, 16, 1.5)  # prefix, batch, speedup the issue asks for
SCALE = 1 / math.sqrt(DIM)


def layout(
    prefix: int, batch: int, kv_heads: int = KV_HEADS, dim: int = DIM, device: str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """(K cache, V cache, the prefix's slots, each sequence's own slots) on `device`: the
    prefix's blocks shared, then each sequence's own blocks, in a cache of exactly that many
    blocks (benchmarks/shared_prefix_gpu.py uses it too)."""
    prefix_blocks = -(-prefix // BLOCK)
    own_blocks = -(-OWN_TOKENS // BLOCK)
    slots = (prefix_blocks + batch * own_blocks) * BLOCK
    gen = torch.Generator(device=device).manual_seed(0)
    k = torch.randn(slots, kv_heads, dim, generator=gen, device=device)
    v = torch.randn(slots, kv_heads, dim, generator=gen, device=device)
    owns = [
        torch.arange(first, first + OWN_TOKENS, device=device)
        for first in ((prefix_blocks + i * own_blocks) * BLOCK for i in range(batch))
    ]
    return k, v, torch.arange(prefix, device=device), owns


def per_sequence_sdpa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: list[torch.Tensor]
) -> None:
    for i, slots in enumerate(ctx):
        torch.nn.functional.scaled_dot_product_attention(
            q[i : i + 1].transpose(0, 1),
            k[slots].transpose(0, 1),
            v[slots].transpose(0, 1),
            scale=SCALE,
            enable_gqa=True,
        )


def per_sequence_attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: list[torch.Tensor]
) -> None:
    for i, slots in enumerate(ctx):
        attend(q[i : i + 1], k[slots], v[slots], len(slots) - 1, SCALE)


def per_sequence_padded(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: list[torch.Tensor]
) -> None:
    attend_padded(q, [(k[slots], v[slots]) for slots in ctx], SCALE)


def shared(
    prefix: int,
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]], None]:
    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: list[torch.Tensor]) -> None:
        head = ctx[0][:prefix]
        suffixes = [(k[slots[prefix:]], v[slots[prefix:]]) for slots in ctx]
        queries = [q[i : i + 1] for i in range(len(ctx))]
        starts = [len(slots) - 1 for slots in ctx]
        shared_prefix_attention(queries, starts, (k[head], v[head]), suffixes, SCALE)

    return run


def timed_ms(run: Callable[[], None], budget_s: float) -> float:
    run()  # warm-up
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 50):
        started = time.perf_counter()
        run()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def measure(prefix: int, batch: int, budget_s: float) -> dict[str, Any]:
    k, v, head, owns = layout(prefix, batch)
    ctx = [torch.cat([head, own]) for own in owns]
    q = torch.randn(batch, HEADS, DIM, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        sdpa = timed_ms(lambda: per_sequence_sdpa(q, k, v, ctx), budget_s)
        own = timed_ms(lambda: per_sequence_attend(q, k, v, ctx), budget_s)
        padded = timed_ms(lambda: per_sequence_padded(q, k, v, ctx), budget_s)
        both = timed_ms(lambda: shared(prefix)(q, k, v, ctx), budget_s)
    per_seq = min(sdpa, own, padded)
    return {
        "prefix_tokens": prefix,
        "batch": batch,
        "per_sequence_sdpa_ms": round(sdpa, 3),
        "per_sequence_attend_ms": round(own, 3),
        "per_sequence_batched_ms": round(padded, 3),
        "shared_prefix_ms": round(both, 3),
        "speedup": round(per_seq / both, 2),
    }


def render(report: dict[str, Any]) -> str:
    rows = report["rows"]
    columns = [
        "prefix_tokens",
        "batch",
        "per_sequence_sdpa_ms",
        "per_sequence_attend_ms",
        "per_sequence_batched_ms",
        "shared_prefix_ms",
        "speedup",
    ]
    table = markdown_table(rows, columns, lambda value, _: "-" if value is None else str(value))
    prefix, batch, want = TARGET
    point = next((r for r in rows if (r["prefix_tokens"], r["batch"]) == (prefix, batch)), None)
    ok = None if point is None else point["speedup"] >= want
    measured = "-" if point is None else f"{point['speedup']}x"
    target = target_row(
        f">= {want}x at prefix {prefix}, batch {batch}", "one decode step's attention", measured, ok
    )
    targets = markdown_table(
        [target], ["target", "subject", "measured", "result"], lambda v, _: str(v)
    )
    lines = [
        "## Shared-prefix attention: one decode step, prefix read once vs per sequence",
        "",
        *header_lines(report),
        "",
        f"One attention layer ({HEADS} query heads, {KV_HEADS} KV heads, head dim {DIM}, float32), "
        f"a paged cache in blocks of {BLOCK}; every sequence shares the prefix and has "
        f"{OWN_TOKENS} tokens of its own; times in ms per step (median). `speedup`: the fastest "
        "per-sequence path over the shared-prefix path.",
        "",
        table,
        "",
        targets,
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only the target's point")
    parser.add_argument("--budget-s", type=float, default=1.0, help="time per path and point")
    args = parser.parse_args(argv)
    report = run_header("shared_prefix.py", argv, "shared and noisy; ratios within one run")
    report["torch_threads"] = torch.get_num_threads()
    points = [(TARGET[0], TARGET[1])] if args.quick else [(p, b) for p in PREFIXES for b in BATCHES]
    report["rows"] = []
    for prefix, batch in points:
        row = measure(prefix, batch, args.budget_s)
        print(row, flush=True)
        report["rows"].append(row)
    finish_header(report)
    block = render(report)
    print(block)
    write_results(RESULTS_PATH, report)
    write_docs_block("shared-prefix", block)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
