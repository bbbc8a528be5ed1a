"""The command line: which sections run with which sizes, where the results go, a partial run
that keeps the sections it skipped from the previous results file, and re-rendering the docs
block from a results file."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from benchmarks import control_plane
from benchmarks.control_plane.admission import SETUPS, AdmissionOptions, run_admission
from benchmarks.control_plane.overhead import OverheadOptions, run_overhead
from benchmarks.control_plane.render import print_tables, render, write_docs
from benchmarks.control_plane.targets import admission_targets, overhead_targets
from benchmarks.report import DOCS_PATH, RESULTS_DIR, ROOT, finish_header, run_header, write_results

RESULTS_PATH = RESULTS_DIR / "control_plane.json"
QUICK_RESULTS_PATH = RESULTS_DIR / "control_plane_quick.json"
FULL_RATES = (250.0, 500.0, 1000.0, 1500.0, 2000.0, 2500.0, 3000.0, 4000.0)
QUICK_RATES = (500.0, 2000.0)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(control_plane.__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short steps, CI smoke")
    parser.add_argument("--skip-vllm", action="store_true", help="admission benchmark only")
    parser.add_argument("--skip-admission", action="store_true", help="vLLM overhead only")
    parser.add_argument("--setups", nargs="+", choices=SETUPS, help="admission setups")
    parser.add_argument("--rates", type=float, nargs="+", help="offered rates, req/s")
    parser.add_argument("--duration", type=float, help="measured seconds per admission step")
    parser.add_argument("--clients", type=int, default=2, help="load generator processes")
    parser.add_argument("--repeats", type=int, help="runs per vLLM workload")
    parser.add_argument("--requests", type=int, help="requests per vLLM workload")
    parser.add_argument(
        "--variants", nargs="+", choices=("bare", "memory", "redis"), help="overhead variants"
    )
    parser.add_argument(
        "--engine-backlogs",
        nargs="+",
        type=_backlog,
        default=(),
        help="also run a memory-queue plane per agent.engine_backlog value (auto or a count), "
        "paired with each other",
    )
    parser.add_argument(
        "--token-flushes",
        nargs="+",
        type=float,
        default=(),
        help="also run a memory-queue plane per agent.token_flush_s value (seconds), paired "
        "with each other",
    )
    parser.add_argument("--poisson-rate", type=float, help="req/s (default: half the burst rate)")
    parser.add_argument(
        "--vllm-cores",
        type=lambda text: tuple(int(c) for c in text.split(",")),
        help="comma-separated cores for the vLLM server (default: the last core; QLM and the "
        "load generator get the others)",
    )
    parser.add_argument("--out", type=Path, help="results JSON (default by --quick)")
    parser.add_argument("--no-docs", action="store_true", help="do not write docs/benchmarks.md")
    parser.add_argument(
        "--keep-skipped",
        action="store_true",
        help="carry the sections this run skips over from the existing results file",
    )
    parser.add_argument(
        "--render", type=Path, metavar="JSON", help="only re-render the docs block from a file"
    )
    parser.add_argument(
        "--model-cache", type=Path, default=Path(tempfile.gettempdir()) / "qlm-bench-cp"
    )
    args = parser.parse_args(argv)
    if args.clients < 1:
        parser.error("--clients must be >= 1")
    return args


def main(argv: Sequence[str]) -> dict[str, Any]:
    args = parse_args(argv)
    if args.render is not None:
        return _render_only(args.render)
    quick = args.quick
    report = run_header("control_plane.py", argv, "shared with other users' jobs")
    with tempfile.TemporaryDirectory(prefix="qlm-bench-cp-") as tmp:
        work_dir = Path(tmp)
        if not args.skip_admission:
            print("admission ...", file=sys.stderr)
            report["admission"] = _admission(args, quick, work_dir)
        if not args.skip_vllm:
            print("overhead over vLLM ...", file=sys.stderr)
            report["overhead"] = _overhead(args, quick, work_dir)
    finish_header(report)
    out = args.out or (QUICK_RESULTS_PATH if quick else RESULTS_PATH)
    if args.keep_skipped:
        report = _with_skipped_sections(report, out)
    report["targets"] = all_targets(report)
    print_tables(report)
    write_results(out, report)
    written = [str(out)]
    if not quick and not args.no_docs:
        write_docs(render(report))
        written.append(str(DOCS_PATH.relative_to(ROOT)))
    print(f"wrote {' and '.join(written)}", file=sys.stderr)
    return report


def all_targets(report: Mapping[str, Any]) -> list[dict[str, str]]:
    targets = []
    if "admission" in report:
        targets += admission_targets(report["admission"]["rows"])
    if "overhead" in report:
        targets += overhead_targets(report["overhead"]["summary"])
    return targets


def _with_skipped_sections(report: dict[str, Any], previous: Path) -> dict[str, Any]:
    """The sections this run skipped, carried over from an earlier results file (each
    section keeps the command, date and load average it was measured with)."""
    if not previous.exists():
        return report
    old = json.loads(previous.read_text(encoding="utf-8"))
    merged = dict(report)
    for section in ("admission", "overhead"):
        if section in report:
            merged[section] = {**report[section], "measured": _provenance(report)}
        elif section in old:
            merged[section] = {"measured": _provenance(old), **old[section]}
    return merged


def _provenance(report: Mapping[str, Any]) -> dict[str, Any]:
    keys = ("command", "date", "code", "loadavg_before", "loadavg_after")
    return {k: report.get(k) for k in keys}


def _render_only(path: Path) -> dict[str, Any]:
    """Print and write the docs block of an existing results file (no measurement)."""
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    report["targets"] = all_targets(report)
    print_tables(report)
    write_docs(render(report))
    print(f"wrote {DOCS_PATH.relative_to(ROOT)} from {path}", file=sys.stderr)
    return report


def _admission(args: argparse.Namespace, quick: bool, work_dir: Path) -> dict[str, Any]:
    opts = AdmissionOptions(
        duration_s=args.duration or (2.0 if quick else 8.0),
        warmup_s=0.5 if quick else 1.0,
        clients=args.clients,
        connections=64,
        closed_connections=32,
        work_dir=work_dir,
    )
    setups = args.setups or (("api x1", "serve") if quick else SETUPS)
    rates = args.rates or (QUICK_RATES if quick else FULL_RATES)
    rows = run_admission(setups, rates, opts)
    return {"options": {**asdict(opts), "work_dir": None}, "rows": rows}


def _overhead(args: argparse.Namespace, quick: bool, work_dir: Path) -> dict[str, Any]:
    opts = OverheadOptions(
        num_requests=args.requests or (16 if quick else 64),
        prompt_words=28,
        output_tokens=32,
        repeats=args.repeats or (1 if quick else 3),
        work_dir=work_dir,
        model_cache=args.model_cache,
        variants=tuple(args.variants or ("bare", "memory", "redis")),
        poisson_rate_per_s=args.poisson_rate,
        vllm_cores=args.vllm_cores,
        engine_backlogs=tuple(args.engine_backlogs),
        token_flushes_s=tuple(args.token_flushes),
    )
    return run_overhead(opts)


def _backlog(text: str) -> str:
    """An agent.engine_backlog value: auto or a count >= 0."""
    if text != "auto" and not text.isdigit():
        raise argparse.ArgumentTypeError(f"engine backlog {text!r}: auto or a count >= 0")
    return text
