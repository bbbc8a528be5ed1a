"""Wiring for the live processes: queue, engines, agents, control loop and API, together
(`qlm serve`) or one at a time (`qlm api`, `qlm controller`, `qlm agent`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import uvicorn

from qlm.agents.agent import Agent
from qlm.agents.pacing import Pacing
from qlm.api.app import create_app
from qlm.api.wait_forecast import QueueForecaster
from qlm.clock import Clock, WallClock
from qlm.config import ConfigError
from qlm.config.api_settings import ApiAppConfig
from qlm.config.serve_config import ServeConfig
from qlm.engine.client import EngineClient
from qlm.metrics import MetricsServer, PlaneMetrics
from qlm.queue.factory import make_queue
from qlm.queue.queue_protocol import GlobalQueue
from qlm.registry import Registry
from qlm.serve import secrets
from qlm.serve.heap import freeze_startup_heap
from qlm.serve.loop import ControlLoop
from qlm.serve.pool_scaling import pool_scaling
from qlm.types import Fleet, Instance

log = logging.getLogger("qlm.serve")


class ServedEngine(EngineClient, Protocol):
    """What the plane runs per instance: an EngineClient with a lifecycle (every engine kind
    here derives from qlm.engine.client.LiveEngine, which gives it one)."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...


EngineFactory = Callable[[ServeConfig, Instance, Fleet, Clock], ServedEngine]
ENGINE_KINDS: Registry[ServedEngine] = Registry("engine")


@ENGINE_KINDS.register("emulated")
def _emulated(config: ServeConfig, instance: Instance, fleet: Fleet, clock: Clock) -> ServedEngine:
    from qlm.config.engine_config import EngineConfig
    from qlm.engine.emulated import EmulatedEngine

    engine: ServedEngine = EmulatedEngine(
        instance,
        fleet.profiles.values(),
        clock,
        config=EngineConfig(standby_models=config.engine.standby_models),
        speedup=config.engine.speedup,
        seed=config.engine.seed,
        output_length=config.engine.output_length,
        stream_interval_s=config.engine.stream_interval_s,
    )
    return engine


@ENGINE_KINDS.register("vllm")
def _vllm(config: ServeConfig, instance: Instance, fleet: Fleet, clock: Clock) -> ServedEngine:
    from qlm.config.vllm_config import VllmEngineConfig
    from qlm.engine.vllm.vllm_engine import VllmEngine

    engine: ServedEngine = VllmEngine(
        instance, VllmEngineConfig.model_validate(config.engine.vllm), clock
    )
    return engine


@ENGINE_KINDS.register("native")
def _native(config: ServeConfig, instance: Instance, fleet: Fleet, clock: Clock) -> ServedEngine:
    from qlm.config.native_config import NativeEngineConfig
    from qlm.engine.native.native_engine import NativeEngine

    engine: ServedEngine = NativeEngine(
        instance, NativeEngineConfig.model_validate(config.engine.native), clock
    )
    return engine


def queue_url(config: ServeConfig) -> str | None:
    """The queue URL: from the environment variable the file names, else from the file."""
    return secrets.queue_url(config.queue, os.environ)


def open_queue(config: ServeConfig) -> GlobalQueue:
    """The queue with its bounds, credentials and TLS files (ConfigError when a secret the
    file names is missing); nothing connects yet."""
    url = queue_url(config)
    return make_queue(url, **secrets.queue_options(config, url, os.environ))


def api_settings(config: ServeConfig) -> ApiAppConfig:
    """The API's settings, with its keys read from where the file says (ConfigError)."""
    return ApiAppConfig.from_config(
        config.qlm,
        config.models,
        config.api,
        secrets.api_keys(config.api, os.environ),
        config.engine.kind,
    )


@dataclass
class Plane:
    """A running control plane (or a part of one) and how to stop it."""

    queue: GlobalQueue
    fleet: Fleet
    agents: list[Agent] = field(default_factory=list)
    engines: list[ServedEngine] = field(default_factory=list)
    loop: ControlLoop | None = None
    server: uvicorn.Server | None = None
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    metrics: PlaneMetrics | None = None  # one registry for every part run in this process
    metrics_server: MetricsServer | None = None  # /metrics of a process without the API

    @property
    def port(self) -> int | None:
        if self.server is None or not self.server.servers:
            return None
        sockets = self.server.servers[0].sockets
        return int(sockets[0].getsockname()[1]) if sockets else None

    @property
    def metrics_port(self) -> int | None:
        return None if self.metrics_server is None else self.metrics_server.port


def plane_metrics(config: ServeConfig, clock: Clock, instance_ids: Sequence[str]) -> PlaneMetrics:
    """The process's recorder on a registry of its own: the API, the control loop and the
    agents it runs all record there (`instance_ids`: the agents', for zero-initialised series)."""
    return PlaneMetrics.for_plane(
        config.qlm,
        clock,
        models=[m.name for m in config.models],
        instances=instance_ids,
        settings=config.metrics,
    )


def _forecaster(plane: Plane, config: ServeConfig, clock: Clock) -> QueueForecaster | None:
    """The API's wait forecast over this plane's queue and fleet (`api.wait_forecast`)."""
    if not config.api.wait_forecast:
        return None
    priority = {c.name: c.priority for c in config.qlm.slo_classes}
    refresh_s, every_s = config.api.plan_refresh_s, config.agent.status_every_s
    return QueueForecaster(plane.queue, plane.fleet, priority, clock, refresh_s, every_s)


async def _start_api(
    plane: Plane, config: ServeConfig, settings: ApiAppConfig, clock: Clock
) -> None:
    app = create_app(
        settings,
        plane.queue,
        clock,
        metrics=plane.metrics,
        forecaster=_forecaster(plane, config, clock),
    )
    if not settings.auth_required and config.api.host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("the API listens on %s without API keys: anyone can submit", config.api.host)
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=config.api.host,
            port=config.api.port,
            log_level="warning",
            lifespan="on",
            http="httptools",
            access_log=False,
            timeout_keep_alive=config.api.keep_alive_s,
        )
    )
    plane.server = server
    plane.tasks.append(asyncio.create_task(server.serve()))
    while not server.started:
        if plane.tasks[-1].done():
            plane.tasks[-1].result()  # raises the server's startup error
        await asyncio.sleep(0.01)


async def _start_agents(
    plane: Plane, config: ServeConfig, clock: Clock, only: Sequence[str] | None
) -> None:
    priority = {c.name: c.priority for c in config.qlm.slo_classes}
    for instance in plane.fleet.instances:
        if only is not None and instance.id not in only:
            continue
        engine = ENGINE_KINDS.create(config.engine.kind, config, instance, plane.fleet, clock)
        plane.engines.append(engine)
        agent = Agent(
            instance,
            engine,
            plane.queue,
            plane.fleet,
            clock,
            config.agent,
            priority,
            metrics=plane.metrics,
            pacing=Pacing.of(config.qlm),
            control=config.qlm.control,
        )
        plane.agents.append(agent)
    await asyncio.gather(*(e.start() for e in plane.engines))
    for agent in plane.agents:
        plane.tasks.append(asyncio.create_task(agent.run(plane.stop)))


@contextlib.asynccontextmanager
async def running_plane(
    config: ServeConfig,
    *,
    clock: Clock | None = None,
    api: bool = True,
    controller: bool = True,
    agents: bool | Sequence[str] = True,
    metrics_port: int | None = None,
) -> AsyncIterator[Plane]:
    """Start the chosen parts; stop them all on exit (engines closed, server shut down).
    They share one metrics registry, exposed at the API's /metrics and, with `metrics_port`,
    on a port of its own (0: a free one)."""
    clock = clock or WallClock()
    # Everything the file refers to is read and checked before any part starts.
    settings = api_settings(config) if api else None
    only = None if agents is True else list(agents or ())
    _check_instances(config, only)
    plane = Plane(open_queue(config), config.fleet())
    here = [i.id for i in plane.fleet.instances if only is None or i.id in only]
    plane.metrics = plane_metrics(config, clock, here if agents else [])
    try:
        if metrics_port is not None:
            server = MetricsServer(plane.metrics.registry, config.metrics.host, metrics_port)
            plane.metrics_server = server.start()
        if agents:
            await _start_agents(plane, config, clock, only)
        if controller:
            plane.loop = ControlLoop(
                config.qlm,
                plane.fleet,
                plane.queue,
                clock,
                config.controller,
                plane.metrics,
                pool_scaling(config, plane.fleet, plane.metrics.registry),
            )
            plane.tasks.append(asyncio.create_task(plane.loop.run(plane.stop)))
        if settings is not None:
            await _start_api(plane, config, settings, clock)
        yield plane
    finally:
        await _shutdown(plane)


def _check_instances(config: ServeConfig, only: Sequence[str] | None) -> None:
    known = [i.id for i in config.instance_list()]
    unknown = [i for i in only or () if i not in known]
    if unknown:
        raise ConfigError(f"--instance {', '.join(unknown)}: not in the fleet; known: {known}")


async def _shutdown(plane: Plane) -> None:
    plane.stop.set()
    if plane.server is not None:
        plane.server.should_exit = True
    for task in plane.tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, 10.0)
    await asyncio.gather(*(e.close() for e in plane.engines), return_exceptions=True)
    await plane.queue.close()
    if plane.metrics_server is not None:
        plane.metrics_server.stop()


async def serve_forever(config: ServeConfig, **parts: bool) -> None:
    """Run until stopped. A process without the API (`qlm controller`, `qlm agent`) serves
    /metrics on `metrics.port`."""
    metrics_port = None if parts.get("api", True) else config.metrics.port
    async with running_plane(config, metrics_port=metrics_port, **parts) as plane:  # type: ignore[arg-type]
        freeze_startup_heap()
        log.info("qlm running; api port %s, metrics port %s", plane.port, plane.metrics_port)
        await plane.stop.wait()
