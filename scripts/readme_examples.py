"""Regenerate the README's example outputs from the commands they show.

    python scripts/readme_examples.py [NAME ...]     (default: every example)
    python scripts/readme_examples.py --list

In README.md an example is a fenced block right after a marker line

    <!-- generated: NAME -->

and its text is whatever the example's command prints now (a run of `make run` takes about a
minute). Nothing in those blocks is typed by hand: rerun this after a change that moves them.
tests/test_readme_examples.py checks every marker names a known example and that the
deterministic ones match what the commands print."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
QLM = [sys.executable, "-m", "qlm.cli"]
MARKER = re.compile(r"<!-- generated: ([a-z0-9-]+) -->\n```[a-z]*\n(.*?)```", re.S)


def run(argv: list[str]) -> str:
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True)
    return done.stdout


def demo() -> str:
    """`make run`: the embedded plane's attainment table (the lines from its header on)."""
    out = run([*QLM, "demo", "--config", "examples/fleet.yaml"])
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("class "))
    return "\n".join(lines[start:]) + "\n"


def plan() -> str:
    """`make plan`: each planner's predicted attainment on the example snapshot."""
    return run([*QLM, "plan", "examples/plan.yaml"])


def summary() -> str:
    """`qlm simulate sims/wa-quick.yaml --policy qlm`: the summary.json it writes."""
    with tempfile.TemporaryDirectory() as out:
        argv = ["simulate", "sims/wa-quick.yaml", "--policy", "qlm", "--out", out]
        run([*QLM, *argv, "--no-progress"])
        doc = json.loads((Path(out) / "summary.json").read_text())
    return json.dumps(doc, indent=1) + "\n"


@dataclass(frozen=True)
class Example:
    make: Callable[[], str]
    deterministic: bool  # the same text on every run


EXAMPLES = {
    "make-run": Example(demo, deterministic=False),
    "make-plan": Example(plan, deterministic=False),  # the MILP stops at a wall-clock limit
    "simulate-summary": Example(summary, deterministic=True),
}


def blocks(text: str) -> dict[str, str]:
    return {m.group(1): m.group(2) for m in MARKER.finditer(text)}


def rewrite(text: str, name: str, body: str) -> str:
    def replace(m: re.Match[str]) -> str:
        if m.group(1) != name:
            return m.group(0)
        fence = m.group(0).split("\n", 2)[1]
        return f"<!-- generated: {name} -->\n{fence}\n{body}```"

    return MARKER.sub(replace, text)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help=f"examples to regenerate: {sorted(EXAMPLES)}")
    parser.add_argument("--list", action="store_true", help="list the examples and stop")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(sorted(EXAMPLES)))
        return 0
    unknown = sorted(set(args.names) - set(EXAMPLES))
    if unknown:
        parser.error(f"unknown examples {unknown}; known: {sorted(EXAMPLES)}")
    text = README.read_text()
    for name in args.names or sorted(blocks(text)):
        print(f"regenerating {name} ...", file=sys.stderr)
        text = rewrite(text, name, EXAMPLES[name].make())
    README.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
