"""Clients for the queue's Redis: a plain server (redis://, rediss://, unix://) or the primary
the Sentinels name (redis+sentinel://).

Through Sentinel every connection asks the Sentinels for the current primary when it
connects, and a connection error drops the pool's idle connections, so the command that
meets a failover reconnects, by the retries of `RedisQueueConfig`, to the replica the
Sentinels promoted. The retries must outlast the failover: about 6 s at the defaults, which
covers Sentinel's `down-after-milliseconds` plus its election when that is set to a few
seconds (the chart sets 2 s; Sentinel's own default, 30 s, needs `retries` raised).

Commands share a bounded pool that makes callers wait for a free connection (a plain
`BlockingConnectionPool`, or `BlockingSentinelPool` below for Sentinel); blocking reads
(streams, plan and change waits) hold a connection each, so they get a pool of their own and
can never starve the commands.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote, urlsplit

import redis.asyncio as redis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool, SentinelManagedConnection
from redis.backoff import ExponentialWithJitterBackoff

from qlm.config.redis_config import RedisQueueConfig


def client_options(config: RedisQueueConfig) -> dict[str, Any]:
    """Keyword arguments for redis.asyncio.Redis.from_url(config.connect_url, ...): timeouts,
    retries with jittered backoff, credentials and TLS from the queue's settings."""
    parts = urlsplit(config.url)
    options: dict[str, Any] = {
        "decode_responses": True,
        "socket_connect_timeout": config.socket_connect_timeout_s,
        "socket_timeout": config.socket_timeout_s,
        "health_check_interval": config.health_check_interval_s,
        # Both pools need it: a pool built outside Redis() gets no retries by default.
        "retry": Retry(
            ExponentialWithJitterBackoff(
                cap=config.retry_backoff_cap_s, base=config.retry_backoff_base_s
            ),
            config.retries,
        ),
    }
    sentinel = config.sentinel
    if sentinel is not None:  # no URL goes to redis-py: db and credentials as options
        options["db"] = sentinel.db
    if config.username is not None or config.password is not None or sentinel is not None:
        url_user, url_password = parts.username, parts.password
        if sentinel is not None:  # redis-py unquotes the URLs it parses, not these
            url_user = None if url_user is None else unquote(url_user)
            url_password = None if url_password is None else unquote(url_password)
        options["username"] = config.username or url_user
        options["password"] = (
            url_password if config.password is None else config.password.get_secret_value()
        )
    if config.tls:
        options["ssl_cert_reqs"] = config.ssl_cert_reqs
        options |= {
            key: value
            for key, value in (
                ("ssl_ca_certs", config.ssl_ca_certs),
                ("ssl_certfile", config.ssl_certfile),
                ("ssl_keyfile", config.ssl_keyfile),
            )
            if value is not None
        }
    return options


class FailoverConnection(SentinelManagedConnection):
    """A connection to the primary that asks the Sentinels where it is on every (re)connect.
    redis-py's own asks only when the pool hands a connection out; the reconnect a command's
    retry makes goes to the address the connection last had, so after a failover every retry
    knocked on the dead primary until the retries ran out (tests/queue/test_redis_sentinel.py)."""

    async def connect_check_health(
        self, check_health: bool = True, retry_socket_connect: bool = True
    ) -> None:
        if not self.is_connected and self.connection_pool.is_master:
            self.host, self.port = await self.connection_pool.get_master_address()
        await super().connect_check_health(
            check_health=check_health, retry_socket_connect=retry_socket_connect
        )


class BlockingSentinelPool(SentinelConnectionPool, redis.BlockingConnectionPool):
    """The primary's pool, named by the Sentinels, that makes a caller wait up to `timeout`
    for a free connection when all `max_connections` are in use (redis-py's own
    SentinelConnectionPool raises at once instead)."""


def commands_client(config: RedisQueueConfig) -> redis.Redis:
    """The client for commands: at most `max_connections`, callers wait `pool_timeout_s`."""
    options = client_options(config)
    if config.sentinel is None:
        pool = redis.BlockingConnectionPool.from_url(
            config.connect_url,
            max_connections=config.max_connections,
            timeout=config.pool_timeout_s,
            **options,
        )
        return redis.Redis.from_pool(pool)
    client: redis.Redis = _sentinels(config).master_for(
        config.sentinel.service,
        connection_pool_class=BlockingSentinelPool,
        connection_class=FailoverConnection,
        max_connections=config.max_connections,
        timeout=config.pool_timeout_s,
        **options,
    )
    return client


def blocking_client(config: RedisQueueConfig) -> redis.Redis:
    """The client for blocking reads: a connection per waiting reader."""
    return store_client(config, max_connections=config.max_blocking_connections)


def store_client(config: RedisQueueConfig, **overrides: Any) -> redis.Redis:
    """A client of its own on the queue's server (the batch and program stores): the queue's
    options with `overrides` (e.g. decode_responses=False for bytes)."""
    options = {**client_options(config), **overrides}
    if config.sentinel is None:
        return redis.Redis.from_url(config.connect_url, **options)
    client: redis.Redis = _sentinels(config).master_for(
        config.sentinel.service, connection_class=FailoverConnection, **options
    )
    return client


def _sentinels(config: RedisQueueConfig) -> Sentinel:
    """The Sentinels of `config.sentinel`; they are asked with the connect timeout, and
    their own password (`sentinel_password`) when they have one."""
    address = config.sentinel
    assert address is not None
    asked: dict[str, Any] = {
        "socket_connect_timeout": config.socket_connect_timeout_s,
        "socket_timeout": config.socket_connect_timeout_s,
    }
    if config.sentinel_password is not None:
        asked["password"] = config.sentinel_password.get_secret_value()
    return Sentinel(list(address.sentinels), sentinel_kwargs=asked)  # type: ignore[no-untyped-call]
