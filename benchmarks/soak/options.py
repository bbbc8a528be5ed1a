"""What one soak run does: its length, the plane setup, the offered load, the queue bound and the
memory sampling, from the command line (--quick: a 10 s smoke)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks import soak


@dataclass(frozen=True)
class SoakOptions:
    minutes: float
    setup: str
    speedup: float
    interactive_rps: float
    chat_share: float  # of interactive arrivals: streaming chat; the rest non-streaming
    batch_rps: float
    burst_every_s: float
    burst_size: int
    max_queued: int
    reserved_queued: int
    sample_s: float
    seed: int
    drain_timeout_s: float


def parse_args(argv: Sequence[str]) -> tuple[SoakOptions, bool, Path | None]:
    parser = argparse.ArgumentParser(description=(soak.__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="load duration")
    parser.add_argument("--quick", action="store_true", help="10 s smoke, no docs update")
    parser.add_argument("--out", type=Path, help="results file (default: benchmarks/results/)")
    parser.add_argument("--setup", choices=("split", "serve"), default="split")
    parser.add_argument("--speedup", type=float, default=20.0, help="emulated engine speedup")
    parser.add_argument("--interactive-rps", type=float, default=4.0)
    parser.add_argument("--chat-share", type=float, default=0.5)
    parser.add_argument("--batch-rps", type=float, default=12.0)
    parser.add_argument("--burst-every-s", type=float, default=60.0)
    parser.add_argument("--burst-size", type=int, default=200)
    parser.add_argument("--max-queued", type=int, default=40)
    parser.add_argument("--reserved-queued", type=int, default=10)
    parser.add_argument("--sample-s", type=float, default=5.0, help="RSS sampling period")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drain-timeout-s", type=float, default=300.0)
    args = parser.parse_args(argv)
    minutes, burst_every_s, sample_s = args.minutes, args.burst_every_s, args.sample_s
    if args.quick:
        minutes, burst_every_s, sample_s = 10.0 / 60.0, 6.0, 0.5
    opts = SoakOptions(
        minutes=minutes,
        setup=args.setup,
        speedup=args.speedup,
        interactive_rps=args.interactive_rps,
        chat_share=args.chat_share,
        batch_rps=args.batch_rps,
        burst_every_s=burst_every_s,
        burst_size=args.burst_size,
        max_queued=args.max_queued,
        reserved_queued=args.reserved_queued,
        sample_s=sample_s,
        seed=args.seed,
        drain_timeout_s=args.drain_timeout_s,
    )
    return opts, args.quick, args.out
