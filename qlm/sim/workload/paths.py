"""Where do the trace files a scenario names live? Relative paths resolve against the scenario
file's folder while it is validated (qlm.config.relative_to, which load_yaml_model sets), and
pydantic field types check that the file exists and its format is known.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator

from qlm.config import resolve_relative
from qlm.sim.traces import TRACE_FORMATS


def _existing_file(path: Path) -> Path:
    full = resolve_relative(path)
    if not full.is_file():
        raise ValueError(f"file not found: {full}")
    return full


def _known_format(fmt: str) -> str:
    if fmt not in TRACE_FORMATS.names():
        raise ValueError(f"unknown trace format {fmt!r}; known: {', '.join(TRACE_FORMATS.names())}")
    return fmt


TracePath = Annotated[Path, AfterValidator(_existing_file)]
TraceFormat = Annotated[str, AfterValidator(_known_format)]
