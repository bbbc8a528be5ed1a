"""How to reach Redis and how to use it: the RedisQueue's one validated configuration.

URL, credentials and TLS (a password never appears in repr; `redacted_url` is for logs), or
the Sentinels that name the primary (`redis+sentinel://`, parsed into `SentinelAddress`), the
replicas a write waits for, the queue's bounds, the batch sizes of its reads and writes, the
two connection pools, and the retries a command gets after a connection error or timeout.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from qlm.config import StrictModel
from qlm.config.queue_limits import check_queue_bounds

SCHEMES = ("redis", "rediss", "unix", "redis+sentinel")
SENTINEL_PORT = 26379


@dataclass(frozen=True, slots=True)
class SentinelAddress:
    """Where the Sentinels listen and which primary (`service`, Sentinel's master name) to
    ask them for, from redis+sentinel://[user:password@]host[:port][,host[:port]...]/service[/db]
    (port 26379 when left out)."""

    sentinels: tuple[tuple[str, int], ...]
    service: str
    db: int

    @classmethod
    def parse(cls, url: str) -> SentinelAddress:
        parts = urlsplit(url)
        hosts = parts.netloc.rpartition("@")[2]
        sentinels = tuple(_host_port(item) for item in hosts.split(",") if item)
        if not sentinels:
            raise ValueError("a redis+sentinel:// URL needs at least one Sentinel host")
        path = [p for p in parts.path.split("/") if p]
        if not path or len(path) > 2:
            raise ValueError("a redis+sentinel:// URL needs its path to be /service[/db]")
        if len(path) == 2 and not path[1].isdigit():
            raise ValueError(f"the db of a redis+sentinel:// URL must be a number, not {path[1]!r}")
        return cls(sentinels, unquote(path[0]), int(path[1]) if len(path) == 2 else 0)


def _host_port(item: str) -> tuple[str, int]:
    """("host", port) from host, host:port, [v6] or [v6]:port."""
    if item.startswith("["):
        host, _, rest = item[1:].partition("]")
        port = rest.removeprefix(":")
    else:
        host, _, port = item.partition(":")
    if not host or (port and not port.isdigit()):
        raise ValueError(f"Sentinel address {item!r} must be host or host:port")
    return host, int(port) if port else SENTINEL_PORT


class RedisQueueConfig(StrictModel):
    """How to reach Redis and how to use it. The URL may carry a user and password
    (redis://user:pass@host:6379/0); rediss:// turns TLS on; redis+sentinel:// names the
    Sentinels that know the primary (redis+sentinel://s1:26379,s2:26379,s3:26379/qlm/0)."""

    url: str = Field(
        default="redis://127.0.0.1:6379/0",
        repr=False,
        description="redis:// or rediss:// (TLS) URL, with optional user:password and db; or "
        "redis+sentinel://[user:password@]host:port,host:port,.../service[/db].",
    )
    sentinel_password: SecretStr | None = Field(
        default=None, description="The Sentinels' own password (their requirepass), if any."
    )
    replicas_to_ack: int = Field(
        default=0,
        ge=0,
        description="Replicas that must hold a write (WAIT) before an enqueue, pull, requeue "
        "or finish returns; 0: the primary alone. With 1 and a replica, a request the API "
        "accepted survives the primary's loss.",
    )
    replica_ack_timeout_s: float = Field(
        default=2.0,
        gt=0,
        description="Longest WAIT for the replicas; past it the write counts as failed "
        "(QueueUnavailableError: the API answers 503).",
    )
    key_prefix: str = Field(
        default="qlm:", description="Prefix of every key; separates deployments and tests."
    )
    username: str | None = Field(default=None, description="Overrides the URL's user.")
    password: SecretStr | None = Field(default=None, description="Overrides the URL's password.")
    max_queued: int | None = Field(
        default=None, ge=0, description="QUEUED requests at most; enqueue raises QueueFullError."
    )
    max_queued_per_tenant: int | None = Field(
        default=None, ge=0, description="QUEUED requests of one tenant at most."
    )
    reserved_queued: int = Field(
        default=0, ge=0, description="Places of max_queued that only reserved_classes may take."
    )
    reserved_classes: frozenset[str] = Field(
        default=frozenset({"interactive"}), description="SLO classes that may use reserved places."
    )
    finished_ttl_s: float = Field(
        default=24 * 3600.0,
        ge=0,
        description="Finished records and their streams expire after this; 0 keeps them.",
    )
    block_chunk_s: float = Field(
        default=5.0,
        gt=0,
        le=60,
        description="Longest single blocking read; stream readers re-check their request "
        "between chunks.",
    )
    max_listed_requests: int = Field(
        default=100_000,
        ge=1,
        description="Newest requests GET /v1/qlm/requests can list, overall and per tenant.",
    )
    snapshot_batch: int = Field(
        default=2000, ge=1, description="Requests read per script call by queued()."
    )
    annotate_batch: int = Field(
        default=500, ge=1, description="Requests annotated per script call."
    )
    socket_connect_timeout_s: float = Field(default=5.0, gt=0)
    socket_timeout_s: float | None = Field(
        default=None, gt=0, description="Per-command timeout; must exceed block_chunk_s."
    )
    max_connections: int = Field(
        default=64,
        ge=1,
        description="Connections for commands; callers wait for a free one (pool_timeout_s).",
    )
    pool_timeout_s: float = Field(
        default=20.0, gt=0, description="Longest wait for a free command connection."
    )
    max_blocking_connections: int = Field(
        default=10_000,
        ge=1,
        description="Connections for blocking reads: one per open stream() or wait_for_change().",
    )
    health_check_interval_s: float = Field(default=30.0, ge=0)
    retries: int = Field(
        default=10,
        ge=0,
        le=100,
        description="Retries of a command after a connection error or timeout, reconnecting "
        "each time, with jittered exponential backoff: about 6 s in all at the defaults, "
        "which rides out a Redis restart on its AOF.",
    )
    retry_backoff_base_s: float = Field(default=0.05, gt=0, description="First backoff step.")
    retry_backoff_cap_s: float = Field(default=1.0, gt=0, description="Longest backoff step.")
    ssl_ca_certs: str | None = Field(default=None, description="CA bundle for rediss://.")
    ssl_certfile: str | None = Field(default=None, description="Client certificate (mTLS).")
    ssl_keyfile: str | None = Field(default=None, description="Client key (mTLS).")
    ssl_cert_reqs: Literal["required", "optional", "none"] = "required"

    @field_validator("url")
    @classmethod
    def _known_scheme(cls, url: str) -> str:
        scheme = urlsplit(url).scheme
        if scheme not in SCHEMES:
            raise ValueError(
                "url must start with redis://, rediss://, unix:// or redis+sentinel://"
            )
        if scheme == "redis+sentinel":
            SentinelAddress.parse(url)  # raises ValueError naming what is wrong
        return url

    @model_validator(mode="after")
    def _bounds_consistent(self) -> RedisQueueConfig:
        check_queue_bounds(self.max_queued, self.max_queued_per_tenant, self.reserved_queued)
        return self

    @property
    def sentinel(self) -> SentinelAddress | None:
        """The Sentinels to ask for the primary; None for a plain server URL."""
        if urlsplit(self.url).scheme != "redis+sentinel":
            return None
        return SentinelAddress.parse(self.url)

    @property
    def tls(self) -> bool:
        return urlsplit(self.url).scheme == "rediss"

    @property
    def redacted_url(self) -> str:
        """The URL without its password, for logs."""
        parts = urlsplit(self.url)
        if parts.password is None:
            return self.url
        netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
        return urlunsplit(parts._replace(netloc=netloc))

    @property
    def connect_url(self) -> str:
        """The URL handed to redis-py: without credentials when `username` or `password` is
        set here (redis-py lets the URL's win over keyword arguments)."""
        parts = urlsplit(self.url)
        if (self.username is None and self.password is None) or "@" not in parts.netloc:
            return self.url
        return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
