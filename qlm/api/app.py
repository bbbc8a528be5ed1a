"""The HTTP API of the live control plane: OpenAI-compatible completions plus QLM's SLO tags,
asynchronous submission and request state, and OpenAI's Files and Batch APIs. Stateless:
every replica talks to the same queue (and batch store).

    app = create_app(settings, queue, clock)
    uvicorn.run(app, host=..., port=...)

The caller owns the queue (creates it before and closes it after serving).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig
from starlette.requests import Request as HttpRequest
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

from qlm.api.batch_routes import add_batch_routes
from qlm.api.batch_runner import BatchRunner
from qlm.api.context import RECEIVED_AT, ApiContext
from qlm.api.context_routes import add_context_routes
from qlm.api.errors import install_error_handlers
from qlm.api.metrics_routes import add_metrics_routes, default_metrics
from qlm.api.openai_routes import add_openai_routes
from qlm.api.openapi import install_openapi
from qlm.api.program_routes import add_program_routes
from qlm.api.program_runner import ProgramRunner
from qlm.api.qlm_routes import add_qlm_routes
from qlm.api.tokens import TokenCounter
from qlm.api.wait_forecast import QueueForecaster
from qlm.batch.job_store import BatchStore, MemoryBatchStore
from qlm.clock import Clock
from qlm.config.api_settings import ApiAppConfig
from qlm.metrics import PlaneMetrics
from qlm.programs.storage import MemoryProgramStore, ProgramStore
from qlm.queue.queue_protocol import GlobalQueue, QueueUnavailableError
from qlm.queue.redis.batch_store import RedisBatchStore
from qlm.queue.redis.program_store import RedisProgramStore
from qlm.queue.redis.queue import RedisQueue

_NO_TELEMETRY: TelemetryConfig = {
    "tracing": False,
    "metrics": False,
    "logs": False,
    "operation_spans": False,
}


class ArrivalStamp:
    """ASGI middleware: stamps each HTTP request with the time it reached the app, before
    its body is read or parsed, so a request's arrival (and its deadlines) include the time
    admission itself took under load."""

    def __init__(self, app: ASGIApp, clock: Clock) -> None:
        self.app = app
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})[RECEIVED_AT] = self.clock.now_s()
        await self.app(scope, receive, send)


def create_app(
    settings: ApiAppConfig,
    queue: GlobalQueue,
    clock: Clock,
    *,
    token_counter: TokenCounter | None = None,
    metrics: PlaneMetrics | None = None,
    batch_store: BatchStore | None = None,
    program_store: ProgramStore | None = None,
    forecaster: QueueForecaster | None = None,
) -> FastAPI:
    """An app serving `settings.models` from `queue`; deadlines are read from `clock`.
    `token_counter` overrides the registered counter named in the settings (e.g. a real
    tokenizer). `metrics` is the process's recorder (a registry of the app's own when None):
    GET /metrics exposes it, GET /dashboard shows it, and admissions are counted on it.
    `forecaster` forecasts each request's wait with the dispatch decision (the fleet's
    processes pass one, `qlm.serve.runtime`); without it waits come from the plan alone."""
    metrics = metrics or default_metrics(settings, clock)
    context = ApiContext.build(settings, queue, clock, token_counter, metrics, forecaster)
    store = batch_store or batch_store_for(queue)
    runner = BatchRunner(context, store, settings.api.batch.poll_s)
    programs = program_store or program_store_for(queue)
    program_runner = ProgramRunner(context, programs, settings.api.programs.poll_s)

    owned = [s for s, given in ((store, batch_store), (programs, program_store)) if given is None]
    app = FastAPI(
        lifespan=_lifespan((runner, program_runner), owned),
        title="QLM",
        summary="SLO-aware queue for LLM serving fleets",
        # QLM's metrics are Prometheus series (qlm/metrics); FastAPI's OpenTelemetry hooks
        # would only cost each request a check of the global providers (~17 us).
        telemetry=_NO_TELEMETRY,
    )
    install_error_handlers(app)
    app.state.batch_store, app.state.batch_runner = store, runner
    app.state.program_store, app.state.program_runner = programs, program_runner

    async def queue_down(_: HttpRequest, exc: Exception) -> Response:
        assert isinstance(exc, QueueUnavailableError)
        return context.unavailable(exc).response()

    app.add_exception_handler(QueueUnavailableError, queue_down)
    add_openai_routes(app, context)
    add_qlm_routes(app, context)
    add_batch_routes(app, context, store)
    add_program_routes(app, context, programs, program_runner)
    add_context_routes(app, context, programs, program_runner)
    add_metrics_routes(app, metrics, clock, queue)
    install_openapi(app, settings)
    app.add_middleware(ArrivalStamp, clock=clock)
    return app


class _Runs(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


class _Closes(Protocol):
    async def close(self) -> None: ...


def _lifespan(
    runners: Sequence[_Runs], owned: Sequence[_Closes]
) -> Callable[[FastAPI], contextlib.AbstractAsyncContextManager[None]]:
    """The batch and program runners run while the app serves (every replica: their steps
    are idempotent, qlm/api/batch_runner.py, qlm/api/program_runner.py); the stores the app
    made close with it."""

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        stop = asyncio.Event()
        tasks = [asyncio.create_task(r.run(stop), name=type(r).__name__) for r in runners]
        try:
            yield
        finally:
            stop.set()
            await asyncio.gather(*tasks)
            for store in owned:
                await store.close()

    return lifespan


def program_store_for(queue: GlobalQueue) -> ProgramStore:
    """The program store beside a queue: in its Redis for a Redis queue, else in this
    process."""
    if isinstance(queue, RedisQueue):
        return RedisProgramStore.for_queue(queue.config)
    return MemoryProgramStore()


def batch_store_for(queue: GlobalQueue) -> BatchStore:
    """The batch store beside a queue: in its Redis for a Redis queue, else in this process."""
    if isinstance(queue, RedisQueue):
        return RedisBatchStore.for_queue(queue.config)
    return MemoryBatchStore()
