"""Fault tests start their own redis-server (each test its own, so a kill or a restart touches
no other test) and need the redis-server binary."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.harness import FaultRedis, redis_for_faults
from tests.redis_server import redis_server_binary


@pytest.fixture
def fault_redis() -> Iterator[FaultRedis]:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    with redis_for_faults() as server:
        yield server
