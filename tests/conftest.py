"""Shared fixtures. Redis: one throwaway redis-server per test session (tests/redis_server.py),
flushed before every test that asks for `redis_url`; `redis_key_prefix` gives a fresh key
prefix per test for code that namespaces its keys. Tests that use them are marked `redis`;
without a redis-server binary they are skipped."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.redis_server import RedisServer, redis_server_binary


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    with RedisServer() as server:
        yield server


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The URL of the session's redis-server, emptied for this test."""
    redis_server.flush()
    return redis_server.url


@pytest.fixture
def redis_key_prefix() -> str:
    """A key prefix no other test uses."""
    return f"test:{uuid.uuid4().hex[:12]}:"
