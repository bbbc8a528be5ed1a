"""Serving a registry: the text the API's GET /metrics returns, and a small HTTP server for the
processes without an API (`qlm controller`, `qlm agent`, port `metrics.port`, default 9400)."""

from __future__ import annotations

import threading
from types import TracebackType
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.exposition import choose_encoder


def render(registry: CollectorRegistry, accept: str | None) -> tuple[bytes, str]:
    """The registry in the format the scraper asked for (OpenMetrics or the text format) and
    the content type to send with it."""
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


class MetricsServer:
    """prometheus_client's threaded HTTP server on one registry; `port=0` picks a free port.
    Scrapes run on the server's thread; prometheus_client's metrics are thread-safe."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int) -> None:
        self.registry = registry
        self.host = host
        self.requested_port = port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the metrics server is not running")
        return int(self._server.server_port)

    def start(self) -> MetricsServer:
        self._server, self._thread = start_http_server(
            self.requested_port, self.host, registry=self.registry
        )
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def __enter__(self) -> MetricsServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
