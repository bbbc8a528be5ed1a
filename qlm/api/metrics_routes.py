"""Operator routes: GET /metrics (Prometheus) and the SLO-attainment dashboard at GET /dashboard,
which polls GET /dashboard/data and GET /dashboard/late (the recent late requests, read from
the queue). The page's HTML, JS and CSS ship in qlm/metrics/static; the
data comes from the process's registry or, with `metrics.prometheus_url`, from Prometheus.
(Admissions, refusals and cancels are counted where they happen: qlm/api/context.py.)"""

from __future__ import annotations

import math
from dataclasses import replace
from importlib import resources

from fastapi import FastAPI
from prometheus_client import CollectorRegistry
from starlette.requests import Request as HttpRequest
from starlette.responses import RedirectResponse, Response

from qlm.api.context import json_response
from qlm.api.errors import SERVER_ERROR, ApiError
from qlm.causes.late import Json, late_rows
from qlm.clock import Clock
from qlm.config.api_settings import ApiAppConfig
from qlm.metrics import (
    Dashboard,
    DashboardSource,
    LocalSource,
    PlaneMetrics,
    render,
)
from qlm.metrics.prometheus import PrometheusError, PrometheusSource
from qlm.queue.listing import RecordFilter
from qlm.queue.queue_protocol import GlobalQueue
from qlm.types import RequestState

STATIC = {
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
}
NO_CACHE = {"cache-control": "no-cache"}
ENDED = frozenset({RequestState.COMPLETED, RequestState.FAILED})
LATE_ROWS = 20  # late requests the dashboard lists
LATE_SCAN = 500  # ended requests read to find them, newest first


def default_metrics(settings: ApiAppConfig, clock: Clock) -> PlaneMetrics:
    """A recorder on a registry of the app's own, for an app built without one."""
    return PlaneMetrics(
        CollectorRegistry(),
        clock,
        slo_classes=[c.name for c in settings.slo_classes],
        models=list(settings.model_names),
    )


def dashboard_source(metrics: PlaneMetrics) -> DashboardSource:
    """Prometheus when the settings name one (multi-replica view), else this process."""
    settings = metrics.settings
    if settings.prometheus_url is None:
        return LocalSource(metrics)
    return PrometheusSource(
        str(settings.prometheus_url),
        history_s=settings.history_s,
        min_step_s=settings.sample_every_s,
        timeout_s=settings.prometheus_timeout_s,
    )


def _asset(name: str) -> bytes:
    return (resources.files("qlm.metrics") / "static" / name).read_bytes()


class LateRequests:
    """The recent late requests, read at most once per `every_s` (like the dashboard's view):
    every open page polls, and each read costs up to `LATE_SCAN` records."""

    def __init__(self, queue: GlobalQueue, clock: Clock, every_s: float) -> None:
        self._queue, self._clock, self._every_s = queue, clock, every_s
        self._read_at_s = -math.inf
        self._view: Json = {}

    async def view(self) -> Json:
        now_s = self._clock.monotonic_s()
        if now_s - self._read_at_s >= self._every_s:
            self._view = await recent_late(self._queue, LATE_ROWS)
            self._read_at_s = now_s
        return self._view


async def recent_late(queue: GlobalQueue, limit: int) -> Json:
    """The newest ended requests that missed their SLO (up to `limit`), from the newest
    `LATE_SCAN` ended ones."""
    page = RecordFilter(states=ENDED, limit=100)
    rows: list[Json] = []
    scanned = 0
    while scanned < LATE_SCAN and len(rows) < limit:
        got = await queue.list_records(page)
        scanned += len(got.records)
        rows += late_rows(got.records)
        if got.next_before_seq is None:
            break
        page = replace(page, before_seq=got.next_before_seq)
    return {"object": "list", "data": rows[:limit], "scanned": scanned}


def add_metrics_routes(
    app: FastAPI, metrics: PlaneMetrics, clock: Clock, queue: GlobalQueue
) -> None:
    dashboard = Dashboard(
        dashboard_source(metrics), clock, metrics.slo_classes, metrics.settings.sample_every_s
    )
    late = LateRequests(queue, clock, metrics.settings.sample_every_s)
    page = _asset("dashboard.html")
    assets = {name: (_asset(name), media) for name, media in STATIC.items()}

    async def prometheus_metrics(http: HttpRequest) -> Response:
        body, content_type = render(metrics.registry, http.headers.get("accept"))
        return Response(body, media_type=content_type)

    app.add_route("/metrics", prometheus_metrics, methods=["GET"])

    @app.get("/dashboard")
    async def dashboard_page() -> Response:
        return Response(page, media_type="text/html; charset=utf-8", headers=NO_CACHE)

    @app.get("/dashboard/")
    async def dashboard_slash() -> Response:
        return RedirectResponse("../dashboard", status_code=308)

    @app.get("/dashboard/data")
    async def dashboard_data() -> Response:
        try:
            view = await dashboard.view()
        except PrometheusError as exc:
            raise ApiError(502, str(exc), type=SERVER_ERROR, code="prometheus_error") from None
        return json_response(view, headers=NO_CACHE)

    @app.get("/dashboard/late")
    async def dashboard_late() -> Response:
        return json_response(await late.view(), headers=NO_CACHE)

    @app.get("/dashboard/static/{name}")
    async def dashboard_asset(name: str) -> Response:
        if name not in assets:
            raise ApiError(404, f"No dashboard asset {name!r}.", code="not_found")
        body, media = assets[name]
        return Response(body, media_type=media, headers=NO_CACHE)
