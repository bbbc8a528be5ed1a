"""A throwaway redis-server for tests: started on a free port in a temporary directory, with no
persistence unless asked, and stopped (and its directory removed) afterwards. Never touches a
Redis on the default port.

    with RedisServer() as server:
        client = redis.Redis.from_url(server.url)

With tls=True it listens only on TLS (a self-signed certificate for 127.0.0.1 made with the
openssl command); connect with rediss:// and `ssl_ca_certs=server.ca_file`.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

import redis

SAN = "subjectAltName=IP:127.0.0.1"


def stop_process(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """SIGTERM, then SIGKILL if it is still running after grace_s; reaped either way."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class RedisServerError(RuntimeError):
    """redis-server is missing or did not come up."""


def redis_server_binary() -> str | None:
    return shutil.which("redis-server")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One redis-server process. `password` sets requirepass; `appendonly` turns AOF on;
    `tls` serves TLS only."""

    def __init__(
        self,
        *,
        password: str | None = None,
        appendonly: bool = False,
        tls: bool = False,
        start_timeout_s: float = 10.0,
    ) -> None:
        self.password = password
        self.appendonly = appendonly
        self.tls = tls
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self.dir: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{auth}127.0.0.1:{self.port}/0"

    @property
    def ca_file(self) -> str:
        assert self.dir is not None, "the server is not started"
        return str(self.dir / "cert.pem")

    def client_options(self) -> dict[str, str]:
        """What a redis-py client needs beyond the URL."""
        return {"ssl_ca_certs": self.ca_file} if self.tls else {}

    def start(self) -> RedisServer:
        binary = redis_server_binary()
        if binary is None:
            raise RedisServerError("redis-server is not installed")
        self.dir = Path(tempfile.mkdtemp(prefix="qlm-redis-"))
        if self.tls:
            self._make_certificate()
        for _ in range(5):  # another process may take the free port first
            self.port = free_port()
            self._process = subprocess.Popen(
                [binary, *self._arguments()],
                cwd=self.dir,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if self._wait_ready():
                return self
            self._kill()
        self.stop()
        raise RedisServerError("redis-server did not start")

    def _make_certificate(self) -> None:
        if shutil.which("openssl") is None:
            raise RedisServerError("openssl is needed for a TLS redis-server")
        command = "req -x509 -newkey rsa:2048 -nodes -days 1 -keyout key.pem -out cert.pem"
        subprocess.run(
            ["openssl", *command.split(), "-subj", "/CN=127.0.0.1", "-addext", SAN],
            cwd=self.dir,
            check=True,
            capture_output=True,
        )

    def _arguments(self) -> list[str]:
        port = ["--port", "0", "--tls-port"] if self.tls else ["--port"]
        args = [*port, str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir)]
        if self.tls:
            args += ["--tls-cert-file", "cert.pem", "--tls-key-file", "key.pem"]
            args += ["--tls-ca-cert-file", "cert.pem", "--tls-auth-clients", "no"]
        args += ["--save", "", "--appendonly", "yes" if self.appendonly else "no"]
        args += ["--logfile", "redis.log", "--protected-mode", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        return args

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + self.start_timeout_s
        client = redis.Redis.from_url(self.url, socket_timeout=1.0, **self.client_options())
        try:
            while time.monotonic() < deadline:
                if self._process is None or self._process.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except redis.ConnectionError:
                    time.sleep(0.02)
            return False
        finally:
            client.close()

    def flush(self) -> None:
        client = redis.Redis.from_url(self.url, **self.client_options())
        try:
            client.flushall()
        finally:
            client.close()

    def _kill(self) -> None:
        if self._process is not None:
            stop_process(self._process, grace_s=5)
        self._process = None

    def stop(self) -> None:
        self._kill()
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
