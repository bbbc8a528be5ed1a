"""Fault tests start their own redis-server (each test its own, so a kill or a restart touches
no other test) and need the redis-server binary."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _pytest.terminal import TerminalReporter

from tests.faults.harness import FaultRedis, redis_for_faults
from tests.faults.report import CHECKED
from tests.redis_server import redis_server_binary


@pytest.fixture
def fault_redis() -> Iterator[FaultRedis]:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    with redis_for_faults() as server:
        yield server


def pytest_terminal_summary(terminalreporter: TerminalReporter) -> None:
    """The counts of every fault report of the run, passed or failed, in the CI log."""
    if CHECKED:
        terminalreporter.section("fault reports")
        for counts in CHECKED:
            terminalreporter.write_line(counts.line())
            for note in counts.notes:
                terminalreporter.write_line(f"    {note}")
