"""Where do the trace files a scenario names live? Relative paths resolve against the scenario
file's folder while it is validated (`relative_to`), and pydantic field types check that the
file exists and its format is known.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator

from qlm.sim.traces import TRACE_FORMATS

_BASE_DIR: ContextVar[Path | None] = ContextVar("qlm_sim_base_dir", default=None)


@contextmanager
def relative_to(base_dir: Path) -> Iterator[None]:
    """Resolve relative trace paths validated inside this block against base_dir."""
    token = _BASE_DIR.set(base_dir)
    try:
        yield
    finally:
        _BASE_DIR.reset(token)


def resolve_relative(path: Path) -> Path:
    """A path as given when absolute (or outside a `relative_to` block), else under the
    block's base folder; resolved."""
    base = _BASE_DIR.get()
    return (path if path.is_absolute() or base is None else base / path).resolve()


def _existing_file(path: Path) -> Path:
    base = _BASE_DIR.get()
    full = path if path.is_absolute() or base is None else base / path
    if not full.is_file():
        raise ValueError(f"file not found: {full}")
    return full.resolve()


def _known_format(fmt: str) -> str:
    if fmt not in TRACE_FORMATS.names():
        raise ValueError(f"unknown trace format {fmt!r}; known: {', '.join(TRACE_FORMATS.names())}")
    return fmt


TracePath = Annotated[Path, AfterValidator(_existing_file)]
TraceFormat = Annotated[str, AfterValidator(_known_format)]
