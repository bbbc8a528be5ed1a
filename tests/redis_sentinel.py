"""A throwaway replicated Redis for tests: a primary, `replicas` replicas and three Sentinels
that watch it (each its own redis-server process on a free port, `redis-server --sentinel` for
the Sentinels, which is what Debian's redis-sentinel runs), stopped and removed afterwards.

    with SentinelGroup() as group:
        url = group.url  # redis+sentinel://127.0.0.1:p1,127.0.0.1:p2,127.0.0.1:p3/qlm/0
        group.kill_primary()  # kill -9; the Sentinels promote a replica
        group.wait_for_failover(timeout_s=30)

Sentinel's timings are short so that a test sees a failover within seconds: the primary is
judged down after `down_after_ms` without an answer, and a failover may be retried after
`failover_timeout_ms`.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

import redis

from tests.redis_server import RedisServer, RedisServerError, free_port, redis_server_binary

SERVICE = "qlm"
SENTINELS = 3
QUORUM = 2


class ReplicaServer(RedisServer):
    """A RedisServer that replicates `primary_port` from its start."""

    def __init__(self, primary_port: int) -> None:
        super().__init__()
        self.primary_port = primary_port

    def _arguments(self) -> list[str]:
        return [*super()._arguments(), "--replicaof", "127.0.0.1", str(self.primary_port)]

    def linked(self) -> bool:
        """Whether it has synced with its primary and follows its writes."""
        with redis.Redis.from_url(self.url, socket_timeout=1.0) as client:
            return bool(client.info("replication").get("master_link_status") == "up")

    def wait_linked(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.linked():
            if time.monotonic() > deadline:
                raise RedisServerError(f"replica on port {self.port} did not sync")
            time.sleep(0.05)


class SentinelGroup:
    """Primary, replicas and Sentinels; `url` is the queue URL that reaches the primary."""

    def __init__(
        self, *, replicas: int = 2, down_after_ms: int = 1000, failover_timeout_ms: int = 10_000
    ) -> None:
        self.replica_count = replicas
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.primary = RedisServer()
        self.replicas: list[ReplicaServer] = []
        self.sentinel_ports: list[int] = []
        self._sentinels: list[subprocess.Popen[bytes]] = []
        self._dir: Path | None = None

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> SentinelGroup:
        binary = redis_server_binary()
        if binary is None:
            raise RedisServerError("redis-server is not installed")
        self._dir = Path(tempfile.mkdtemp(prefix="qlm-sentinel-"))
        try:
            self.primary.start()
            for _ in range(self.replica_count):
                replica = ReplicaServer(self.primary.port)
                self.replicas.append(replica)
                replica.start()
            self._wait(self._replicas_linked, "replicas did not sync with the primary")
            for index in range(SENTINELS):
                self._start_sentinel(binary, index)
            self._wait(self._sentinels_agree, "Sentinels did not discover each other")
        except BaseException:
            self.stop()
            raise
        return self

    def _start_sentinel(self, binary: str, index: int) -> None:
        assert self._dir is not None
        port = free_port()
        folder = self._dir / f"sentinel-{index}"
        folder.mkdir()
        conf = folder / "sentinel.conf"  # Sentinel rewrites its file: one of its own each
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {folder}\n"
            "logfile sentinel.log\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} {QUORUM}\n"
            f"sentinel down-after-milliseconds {SERVICE} {self.down_after_ms}\n"
            f"sentinel failover-timeout {SERVICE} {self.failover_timeout_ms}\n"
            f"sentinel parallel-syncs {SERVICE} 1\n"
        )
        self.sentinel_ports.append(port)
        self._sentinels.append(
            subprocess.Popen(
                [binary, str(conf), "--sentinel"],
                cwd=folder,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )

    def _replicas_linked(self) -> bool:
        return all(replica.linked() for replica in self.replicas)

    def _sentinels_agree(self) -> bool:
        """Every Sentinel knows the others and every replica."""
        for port in self.sentinel_ports:
            try:
                with redis.Redis(port=port, socket_timeout=1.0, decode_responses=True) as client:
                    others = client.execute_command("SENTINEL", "SENTINELS", SERVICE)
                    replicas = client.execute_command("SENTINEL", "REPLICAS", SERVICE)
            except redis.RedisError:
                return False
            if len(others) < SENTINELS - 1 or len(replicas) < self.replica_count:
                return False
        return True

    def primary_port(self) -> int | None:
        """The port of the primary the first Sentinel that answers names."""
        for port in self.sentinel_ports:
            try:
                with redis.Redis(port=port, socket_timeout=1.0, decode_responses=True) as client:
                    address = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
            except redis.RedisError:
                continue
            if address:
                return int(address[1])
        return None

    def kill_primary(self) -> int:
        """kill -9 the current primary (it stays down); its port."""
        port = self.primary_port()
        for server in [self.primary, *self.replicas]:
            if server.port == port and server._process is not None:
                server._process.kill()
                server._process.wait()
                server._process = None
                return port
        raise RedisServerError(f"no running server is the primary (Sentinels name {port})")

    def wait_for_failover(self, old_port: int, timeout_s: float) -> float:
        """Seconds until the Sentinels name a new primary that answers as one."""
        start = time.monotonic()
        self._wait(lambda: self._promoted(old_port), "no replica was promoted", timeout_s)
        return time.monotonic() - start

    def _promoted(self, old_port: int) -> bool:
        port = self.primary_port()
        if port is None or port == old_port:
            return False
        try:
            with redis.Redis(port=port, socket_timeout=1.0, decode_responses=True) as client:
                return bool(client.info("replication").get("role") == "master")
        except redis.RedisError:
            return False

    @staticmethod
    def _wait(ready: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            if time.monotonic() > deadline:
                raise RedisServerError(what)
            time.sleep(0.1)

    def stop(self) -> None:
        for process in self._sentinels:
            process.kill()
            process.wait()
        self._sentinels.clear()
        for server in [*self.replicas, self.primary]:
            server.stop()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def __enter__(self) -> SentinelGroup:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
