"""What every benchmark script does around its measurement: say where and how it ran (a header
of command, date, machine, load average and code version), keep its results file, and replace
its own marked block of docs/benchmarks.md without touching the other scripts' blocks.

Every benchmark runs as a module from the repository root (`.venv/bin/python -m
benchmarks.x`), so `benchmarks.*`, `tests.*` and `qlm.*` import as they are, without path
edits. The larger benchmarks are packages (benchmarks/fidelity/, control_plane/, sim_quality/,
soak/, solver/, ...), run by their `__main__.py`. README.md lists them all.

The header is a plain dict because it travels in the results JSON: a script that re-renders
its block from an old results file (control_plane.py --render) reads the same keys back.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS_PATH = ROOT / "docs" / "benchmarks.md"
RESULTS_DIR = ROOT / "benchmarks" / "results"
PYTHON = ".venv/bin/python"
CODE_PATHS = ("qlm/*.py", "qlm/*.yaml")  # what a benchmark measures: dirty docs do not count


# --- docs/benchmarks.md ----------------------------------------------------------------------


def markers(name: str) -> tuple[str, str]:
    """The begin and end comments around the block `name` in the docs file."""
    return f"<!-- {name}:begin -->", f"<!-- {name}:end -->"


def write_docs_block(name: str, block: str, path: Path = DOCS_PATH) -> None:
    """Replace the block `name` in `path` in place, or append it when the file has none; every
    other byte of the file, other benchmarks' blocks included, stays as it is."""
    begin, end = markers(name)
    text = path.read_text(encoding="utf-8") if path.exists() else "# Benchmarks\n"
    wrapped = f"{begin}\n{block}\n{end}"
    head, found, rest = text.partition(begin)
    if found and end in rest:
        text = head + wrapped + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + wrapped + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


# --- run header ------------------------------------------------------------------------------


def command_line(script: str, argv: Sequence[str]) -> str:
    """The command that reproduces this run, as the docs tell a reader to type it."""
    module = "benchmarks." + script.removesuffix(".py")
    return shlex.join([PYTHON, "-m", module, *argv])


def load_average() -> tuple[float, float, float] | None:
    """1, 5 and 15 minute load averages (None where the OS has none): on a shared machine
    they say how much of it other jobs took while the figures were measured."""
    try:
        one, five, fifteen = os.getloadavg()
    except OSError:
        return None
    return round(one, 2), round(five, 2), round(fifteen, 2)


def code_version(root: Path = ROOT) -> str:
    """The commit measured, and whether the measured code (qlm/) had uncommitted changes."""
    try:
        head = _git(root, "rev-parse", "--short", "HEAD")
        dirty = _git(root, "status", "--porcelain", "--", *CODE_PATHS)
    except (OSError, subprocess.CalledProcessError):
        return "unknown (no git)"
    return f"{head}{' + uncommitted changes in qlm/' if dirty else ''}"


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def machine(note: str) -> str:
    """The core count and a script's word on how to read its figures on this machine."""
    return f"os.cpu_count() = {os.cpu_count()}; {note}"


def platform_description() -> str:
    return f"{platform.platform()}, Python {platform.python_version()}"


def run_header(script: str, argv: Sequence[str], machine_note: str) -> dict[str, Any]:
    """Taken before the measurement (the code version too: others may commit while it runs);
    call `finish_header` after it for the closing load average."""
    return {
        "command": command_line(script, argv),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": machine(machine_note),
        "platform": platform_description(),
        "code": code_version(),
        "loadavg_before": load_average(),
    }


def finish_header(report: dict[str, Any]) -> None:
    report["loadavg_after"] = load_average()


def format_loads(values: Sequence[float] | None) -> str:
    return "-" if not values else ", ".join(f"{v:.2f}" for v in values)


def header_lines(report: Mapping[str, Any]) -> list[str]:
    """The markdown lines under a block's title; the load-average line only where the run
    recorded one (results files written before it was recorded have none)."""
    lines = [
        f"Command: `{report['command']}`  ",
        f"Date: {report['date']}  ",
        f"Machine: {report['machine']} ({report['platform']})  ",
    ]
    if "loadavg_before" in report:
        lines.append(
            "Load average (1, 5, 15 min) before / after: "
            f"{format_loads(report['loadavg_before'])} / "
            f"{format_loads(report.get('loadavg_after'))}  "
        )
    return [*lines, f"Code: {report['code']}"]


# --- results files ---------------------------------------------------------------------------


def json_safe(value: Any) -> Any:
    """Strict JSON: NaN and infinities become null (json.dumps would write the non-standard
    NaN), paths strings, tuples lists, mapping keys strings."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    return value


def write_results(path: Path, data: Any) -> None:
    """Write `data` as indented strict JSON, creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(json_safe(data), indent=2, allow_nan=False)
    path.write_text(text + "\n", encoding="utf-8")
