"""Shared fixtures. Redis: one throwaway redis-server per test session (tests/redis_server.py),
flushed before every test that asks for `redis_url`; `redis_key_prefix` gives a fresh key
prefix per test for code that namespaces its keys. Tests that use them are marked `redis`;
without a redis-server binary they are skipped.

`make test` runs the suite on several pytest-xdist processes, which hand out tests by node
id: items that share one (schemathesis's per-operation items) would run once. Such items are
marked `one_process` and run in a pytest process of their own; collecting any other shared
node id is an error (`pytest_collection_modifyitems`), so none is silently run once."""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator, Sequence

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    shared_ids(items)


def shared_ids(items: Sequence[pytest.Item]) -> None:
    """Refuse a node id that several items share unless they are marked `one_process`."""
    counts = Counter(item.nodeid for item in items)
    marked = {item.nodeid for item in items if item.get_closest_marker("one_process")}
    shared = sorted(n for n, count in counts.items() if count > 1 and n not in marked)
    if shared:
        raise pytest.UsageError(
            "tests sharing a node id would run once under pytest-xdist; give them distinct "
            f"ids or mark them one_process: {', '.join(shared)}"
        )
