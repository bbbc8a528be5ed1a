"""The dashboard's readings from a Prometheus server (settings `metrics.prometheus_url`), for a
deployment whose API, controllers and agents run apart: each reading becomes one instant query
(`sum by (slo_class) (qlm_slo_met_total)`), the history one range query per series."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import httpx

from qlm.metrics.history import HISTORY_READINGS, HistoryPoint
from qlm.metrics.hooks import PlaneEvent
from qlm.metrics.readings import Reading, Series

MAX_POINTS = 300  # range queries ask for at most this many steps


class PrometheusError(RuntimeError):
    """Prometheus did not answer a query, or answered with an error."""


class PrometheusSource:
    name = "prometheus"

    def __init__(
        self,
        base_url: str,
        *,
        history_s: float,
        min_step_s: float,
        timeout_s: float,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.history_s = history_s
        self.min_step_s = min_step_s
        self.timeout_s = timeout_s
        self._transport = transport

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.base_url, timeout=self.timeout_s, transport=self._transport
        )

    async def read(self, readings: Sequence[Reading]) -> dict[Reading, Series]:
        async with self._client() as client:
            results = await asyncio.gather(
                *(_query(client, "/api/v1/query", {"query": r.promql()}) for r in readings)
            )
        return {r: _series(r, result) for r, result in zip(readings, results, strict=True)}

    async def history(self, now_s: float) -> list[HistoryPoint]:
        step_s = max(self.min_step_s, self.history_s / MAX_POINTS)
        window = {"start": now_s - self.history_s, "end": now_s, "step": step_s}
        keys = list(HISTORY_READINGS)
        async with self._client() as client:
            results = await asyncio.gather(
                *(
                    _query(
                        client,
                        "/api/v1/query_range",
                        {"query": HISTORY_READINGS[k].promql(), **window},
                    )
                    for k in keys
                )
            )
        points: dict[float, dict[str, dict[str, float]]] = {}
        for key, result in zip(keys, results, strict=True):
            for item in result:
                slo_class = item["metric"].get("slo_class", "")
                for at_s, value in item["values"]:
                    slot = points.setdefault(float(at_s), {k: {} for k in keys})
                    slot[key][slo_class] = _number(value)
        return [HistoryPoint(at_s, values) for at_s, values in sorted(points.items())]

    def events(self) -> list[PlaneEvent]:
        return []  # events live in each process; the counters per instance are in the view


async def _query(
    client: httpx.AsyncClient, path: str, params: dict[str, Any]
) -> list[dict[str, Any]]:
    try:
        response = await client.get(path, params=params)
    except httpx.HTTPError as exc:
        raise PrometheusError(f"{client.base_url}{path}: {exc!r}") from exc
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code != 200 or body.get("status") != "success":
        error = body.get("error") or response.text[:200]
        raise PrometheusError(f"{path} {params.get('query')!r}: {response.status_code} {error}")
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def _series(reading: Reading, result: list[dict[str, Any]]) -> Series:
    return {
        tuple(item["metric"].get(label, "") for label in reading.by): _number(item["value"][1])
        for item in result
    }


def _number(text: str) -> float:
    value = float(text)
    return 0.0 if math.isnan(value) else value
