"""Files and lines per package of qlm/ (and benchmarks/) at a git revision, as a Markdown table.

    python scripts/tree_table.py [REV] [--compare OLD_REV]

Used for the architecture note and closing notes: the tree side by side before and after."""

from __future__ import annotations

import argparse
import subprocess
from collections import defaultdict

ROOTS = ("qlm", "benchmarks")


def count(rev: str) -> dict[str, tuple[int, int]]:
    """package folder -> (python files, lines) at rev."""
    names = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", rev, *ROOTS],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for name in names:
        if not name.endswith(".py"):
            continue
        text = subprocess.run(
            ["git", "show", f"{rev}:{name}"], capture_output=True, text=True, check=True
        ).stdout
        folder = name.rpartition("/")[0]
        out[folder][0] += 1
        out[folder][1] += len(text.splitlines())
    return {k: (v[0], v[1]) for k, v in out.items()}


def table(new: dict[str, tuple[int, int]], old: dict[str, tuple[int, int]] | None) -> str:
    rows = ["| package | files | lines |" + (" files before | lines before |" if old else "")]
    rows.append("|---|---:|---:|" + ("---:|---:|" if old else ""))
    for key in sorted(set(new) | set(old or {})):
        files, lines = new.get(key, (0, 0))
        row = f"| `{key}` | {files} | {lines} |"
        if old is not None:
            before = old.get(key, (0, 0))
            row += f" {before[0]} | {before[1]} |"
        rows.append(row)
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("rev", nargs="?", default="HEAD")
    parser.add_argument("--compare", default=None, help="an older revision, shown beside")
    args = parser.parse_args()
    old = count(args.compare) if args.compare else None
    print(table(count(args.rev), old))


if __name__ == "__main__":
    main()
