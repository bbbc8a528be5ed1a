"""Shared-prefix attention on a GPU: one decode step's attention for a batch whose sequences
share a prefix, with the Triton kernel (qlm/engine/native/triton_attention.py) reading the
prefix once for the batch, against the same kernel reading each sequence's whole context
(paged attention without sharing, one launch for the batch) and against torch's own paths.

    python3 -m benchmarks.shared_prefix_gpu --out results.json   # on a machine with CUDA
    .venv/bin/python -m benchmarks.shared_prefix_gpu --render results.json  # the docs block

Needs torch with CUDA and triton (the qlm environment on this CPU machine has neither: the
run happens where a GPU is lent, and `--render` writes the docs block from its results file
here). Layout as in benchmarks/shared_prefix.py: one paged cache ([slots, kv heads, dim],
blocks of 16 slots), every sequence with the prefix and 32 tokens of its own, one decode query
per sequence, float32. Two shapes: the CPU benchmark's (16 query heads, 4 KV heads, dim 64)
and a 7B-class layer (32 query heads, 8 KV heads, dim 128). Paths:

- `triton_shared_ms`: `shared_prefix_decode`, two launches (prefix once, all suffixes) + merge;
- `triton_paged_ms`: `attend_segments` with each sequence's whole context as its segment;
- `sdpa_loop_ms`: torch's scaled_dot_product_attention per sequence (a Python loop);
- `torch_padded_ms`: `attend_padded`, every context gathered and padded into one batch.

The torch paths gather every context, so they run only up to 2^20 context tokens a step ("-"
beyond). The error check compares the first 16 sequences with the SDPA loop's.

Times: triton.testing.do_bench's median (CUDA events, L2 flushed between runs). Every point
also checks both Triton paths against the SDPA loop's output (`max_error`).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
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
from benchmarks.shared_prefix import BLOCK, OWN_TOKENS, layout
from qlm.engine.native.attention import attend_padded

RESULTS_PATH = RESULTS_DIR / "shared_prefix_gpu.json"
SHAPES = ((16, 4, 64), (32, 8, 128))  # query heads, kv heads, head dim
PREFIXES = (256, 1024, 2048, 4096, 16384)
BATCHES = (1, 16, 64, 256)
TORCH_TOKENS = 1 << 20  # the torch paths gather every context: beyond this many tokens, skipped
CHECKED = 16  # sequences whose output is checked against the SDPA loop's
TARGET = (2048, 16, 1.5)  # prefix, batch, speedup over the paged kernel (the CPU target's point)
PATHS = ("triton_shared_ms", "triton_paged_ms", "sdpa_loop_ms", "torch_padded_ms")

Run = Callable[[], torch.Tensor]


def paths(shape: tuple[int, int, int], prefix: int, batch: int, device: str) -> dict[str, Run]:
    from qlm.engine.native.triton_attention import attend_segments, shared_prefix_decode

    heads, kv_heads, dim = shape
    k, v, head, owns = layout(prefix, batch, kv_heads, dim, device)
    gen = torch.Generator(device=device).manual_seed(1)
    q = torch.randn(batch, heads, dim, generator=gen, device=device)
    scale = 1 / math.sqrt(dim)
    whole = [torch.cat([head, own]) for own in owns]
    flat = torch.cat(whole)
    lengths = [len(w) for w in whole]
    grouped = q.view(batch, kv_heads, heads // kv_heads, dim)

    def sdpa_loop(members: int = batch) -> torch.Tensor:
        return torch.cat(
            [
                torch.nn.functional.scaled_dot_product_attention(
                    q[i : i + 1].transpose(0, 1),
                    k[s].transpose(0, 1),
                    v[s].transpose(0, 1),
                    scale=scale,
                    enable_gqa=True,
                ).transpose(0, 1)
                for i, s in enumerate(whole[:members])
            ]
        )

    return {
        "triton_shared_ms": lambda: shared_prefix_decode(q, k, v, head, owns, scale),
        "triton_paged_ms": lambda: attend_segments(grouped, k, v, flat, lengths, scale)[0].reshape(
            batch, heads, dim
        ),
        "sdpa_loop_ms": sdpa_loop,
        "reference": lambda: sdpa_loop(min(batch, CHECKED)),
        "torch_padded_ms": lambda: attend_padded(q, [(k[s], v[s]) for s in whole], scale)[0],
    }


def measure(shape: tuple[int, int, int], prefix: int, batch: int) -> dict[str, Any]:
    from triton.testing import do_bench

    runs = paths(shape, prefix, batch, "cuda")
    with torch.inference_mode():
        want = runs.pop("reference")()
        error = max(
            float((runs[name]()[: len(want)] - want).abs().max())
            for name in ("triton_shared_ms", "triton_paged_ms")
        )
        times = {
            name: do_bench(run, warmup=10, rep=60, return_mode="median")
            for name, run in runs.items()
            if name.startswith("triton") or (prefix + OWN_TOKENS) * batch <= TORCH_TOKENS
        }
    heads, kv_heads, dim = shape
    row: dict[str, Any] = {"shape": f"{heads}/{kv_heads}/{dim}", "prefix_tokens": prefix}
    row["batch"] = batch
    row.update({name: round(times[name], 4) if name in times else None for name in PATHS})
    row["speedup_vs_paged"] = round(times["triton_paged_ms"] / times["triton_shared_ms"], 2)
    best = min(times[p] for p in PATHS[1:] if p in times)
    row["speedup_vs_best"] = round(best / times["triton_shared_ms"], 2)
    row["max_error"] = float(f"{error:.2e}")
    return row


def render(report: dict[str, Any]) -> str:
    rows = report["rows"]
    columns = ["shape", "prefix_tokens", "batch", *PATHS, "speedup_vs_paged", "speedup_vs_best"]
    table = markdown_table(rows, [*columns, "max_error"], lambda v, _: "-" if v is None else str(v))
    prefix, batch, want = TARGET
    targets = []
    for shape in SHAPES:
        name = "/".join(map(str, shape))
        point = next(
            (
                r
                for r in rows
                if (r["shape"], r["prefix_tokens"], r["batch"]) == (name, *TARGET[:2])
            ),
            None,
        )
        measured = "-" if point is None else f"{point['speedup_vs_paged']}x"
        ok = None if point is None else point["speedup_vs_paged"] >= want
        subject = f"heads {name}, one decode step's attention, against the paged kernel"
        targets.append(
            target_row(f">= {want}x at prefix {prefix}, batch {batch}", subject, measured, ok)
        )
    worst = max(r["max_error"] for r in rows)
    wins = [r for r in rows if r["speedup_vs_paged"] >= 1]
    floor = min(r["triton_shared_ms"] for r in rows)
    reading = (
        f"The shared path is faster than the paged kernel at {len(wins)} of {len(rows)} points "
        "(where batch x prefix is large); its fastest step, "
        f"{floor} ms, is the floor of its three launches (prefix, own slots, combine) and "
        "the host work around them, which small batches do not amortise. Times move between "
        "runs on the lent machine (a point can double); compare paths within a row."
    )
    return "\n".join(
        [
            "## Shared-prefix attention on a GPU: prefix read once or per sequence",
            "",
            *header_lines(report)[:-1],
            header_lines(report)[-1] + "  ",
            f"Device: {report['device']}; torch {report['torch']}, triton {report['triton']}",
            "",
            "Shapes `query heads/kv heads/head dim`, float32, a paged cache in blocks of "
            f"{BLOCK}; every sequence shares the prefix and has {OWN_TOKENS} tokens of its own; "
            "times in ms per step (triton.testing.do_bench median). `speedup_vs_paged`: the same "
            "kernel reading each sequence's whole context over the shared path; "
            "`speedup_vs_best`: the fastest non-shared path over the shared path. Largest "
            f"difference of either Triton path from the SDPA loop's output: {worst:.1e}.",
            "",
            table,
            "",
            reading,
            "",
            markdown_table(
                targets, ["target", "subject", "measured", "result"], lambda v, _: str(v)
            ),
        ]
    )


def run(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    import triton

    report = run_header("shared_prefix_gpu.py", argv, "a lent GPU machine; one run")
    if args.code:
        report["code"] = args.code
    report["device"] = torch.cuda.get_device_name()
    report["torch"], report["triton"] = torch.__version__, triton.__version__
    report["rows"] = []
    for shape in SHAPES:
        for prefix in PREFIXES:
            for batch in BATCHES:
                row = measure(shape, prefix, batch)
                print(json.dumps(row), flush=True)
                report["rows"].append(row)
    finish_header(report)
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS_PATH, help="results file to write")
    parser.add_argument("--code", help="the code version to record (where git is absent)")
    parser.add_argument("--render", type=Path, help="write the docs block from this results file")
    args = parser.parse_args(argv)
    if args.render is not None:
        report = json.loads(args.render.read_text(encoding="utf-8"))
        print(render(report))
        write_docs_block("shared-prefix-gpu", render(report))
        return 0
    if not torch.cuda.is_available():
        print("shared_prefix_gpu.py: no CUDA device here (use --render on a results file)")
        return 2
    report = run(args, argv)
    write_results(args.out, report)
    print(render(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
