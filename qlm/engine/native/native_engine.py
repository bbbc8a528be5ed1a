"""NativeEngine: the native runner behind the EngineClient protocol, on the wall clock.

Question answered: how does an agent drive QLM's own engine? Like any engine (client.py): it
submits, aborts and swaps models; it polls events and observes state. A background asyncio
task runs `NativeRunner.step` in a worker thread while there is work, and turns what each step
sampled into events: FirstToken, TokenChunk (text decoded with the checkpoint's tokenizer,
every `stream_every_steps` steps), RequestFinished. The runner is touched only between steps
(operations that come during a step wait for its end), and `observe` reads the engine's own
record of the requests it holds, so no call races with the worker thread.

Sampling settings honoured (Request.sampling): temperature, top_p, seed, ignore_eos, stop
(strings: the output is cut before the first one). max_tokens is capped by what the KV cache
and the model's positions hold (as the engine model caps it), and a prompt that does not fit
alone is refused. A request without text (QLM's tests and
benchmarks give only a token count) is `filler_token_id` repeated. No KV swapping to CPU
(`supports_kv_swap` False; swap_out and swap_in are refused).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer

from qlm.clock import Clock
from qlm.config.native_config import NativeEngineConfig
from qlm.engine.client import EventBuffer, LiveEngine
from qlm.engine.engine_types import (
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
from qlm.engine.native.blocks import KvCache
from qlm.engine.native.checkpoint import load_checkpoint
from qlm.engine.native.client_view import LiveRequest, decode
from qlm.engine.native.runner_config import RunnerConfig
from qlm.engine.native.sampling import sampling_of, stops_of
from qlm.engine.native.step_runner import Emitted, NativeRunner, StepResult
from qlm.types import Instance, Request

CONTEXT_PREFIX = "ctx:"  # context ids in the runner (request sequences are "<id>#<n>")


@dataclass(frozen=True, slots=True)
class _Loaded:
    model: str
    runner: NativeRunner
    tokenizer: Tokenizer | None


class NativeEngine(LiveEngine):
    def __init__(self, instance: Instance, config: NativeEngineConfig, clock: Clock) -> None:
        self._instance = instance
        self.config = config
        self.clock = clock
        if instance.loaded_model is not None and instance.loaded_model not in config.models:
            raise EngineError(f"{instance.id} starts with {instance.loaded_model!r}, not in models")
        self._events = EventBuffer()
        self._live: dict[str, LiveRequest] = {}
        self._submissions = 0  # numbers each submission's runner sequence
        self._failed: str | None = None
        self._step: asyncio.Future[StepResult] | None = None
        self._loaded: _Loaded | None = None
        self._loading: str | None = instance.loaded_model  # read at start: no ModelLoaded
        self._announce = False  # whether the load in progress ends with a ModelLoaded event
        self._pending: list[Callable[[NativeRunner], None]] = []  # runner calls for after a step
        self._stepping = False
        self._steps = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        if config.torch_threads is not None:
            torch.set_num_threads(config.torch_threads)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._task is None:
            self._closing = False
            self._task = asyncio.create_task(self._run(), name=f"native-{self.instance_id}")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            self._closing = True
            self._wake.set()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._step is not None:  # the worker thread's step: let it end before anything else
            await asyncio.wait([self._step])

    async def wait_ready(self, timeout_s: float = 120.0) -> None:
        """Until the model being loaded is served (EngineError past the timeout)."""
        async with asyncio.timeout(timeout_s):
            while self._loading is not None and self._failed is None:
                await asyncio.sleep(0.01)
        if self._failed is not None:
            raise EngineError(self._failed)

    # ------------------------------------------------------------------ EngineClient

    @property
    def instance_id(self) -> str:
        return self._instance.id

    def observe(self) -> EngineObservation:
        loaded, config = self._loaded, self.config
        state = EngineState.LOADING if self._loading else EngineState.READY
        if loaded is None and self._loading is None:
            state = EngineState.EMPTY
        if self._failed is not None:
            state = EngineState.FAILED
        pool = None if loaded is None or self._loading else loaded.runner.pool
        capacity = 0 if pool is None else pool.num_blocks * pool.block_size
        used = 0 if pool is None else (pool.num_blocks - pool.free_blocks) * pool.block_size
        return EngineObservation(
            instance_id=self.instance_id,
            state=state,
            model=self._loading or (None if loaded is None else loaded.model),
            requests=tuple(self._view(live) for live in self._live.values()),
            kv_used_tokens=used,
            kv_capacity_tokens=capacity,
            max_num_seqs=config.max_num_seqs,
            at_s=self.clock.now_s(),
        )

    def submit(self, request: Request, context_id: str | None = None) -> None:
        """Queue `request`; with `context_id`, its prompt continues that filled context
        (contexts.py) and the context's KV is reused instead of computed."""
        loaded = self._ready_for(request)
        prompt = self._prompt_ids(request, first=context_id is None)
        before = 0 if context_id is None else self.context_tokens(context_id)
        room = _room_tokens(loaded.runner) - before - len(prompt)
        if not before + len(prompt) or room < 1:
            raise EngineError(f"request {request.id}: a {len(prompt)}-token prompt does not fit")
        sampling = sampling_of(request, min(request.max_output_tokens, room))
        self._submissions += 1
        runner_id = f"{request.id}#{self._submissions}"
        if context_id is None:
            self._later(lambda runner: runner.add(runner_id, prompt, sampling))
        else:
            parent = CONTEXT_PREFIX + context_id
            self._later(lambda runner: runner.fork(parent, runner_id, sampling, prompt))
        tokens = before + len(prompt)
        live = LiveRequest(request, runner_id, tokens, sampling.max_tokens, stops_of(request))
        self._live[request.id] = live
        self._wake.set()

    def on_runner(self, call: Callable[[NativeRunner], None]) -> None:
        """Apply `call` to the runner between steps (contexts.py's operations)."""
        self._later(call)
        self._wake.set()

    def tokenize(self, text: str, first: bool = True) -> list[int]:
        """`text` as the served model's tokens, with the tokenizer's special tokens when it
        is `first` (a prompt's start), without when it continues a context."""
        loaded = self._loaded
        if loaded is None or self._loading is not None:
            raise EngineError(f"{self.instance_id} is not ready (state {self.observe().state})")
        if loaded.tokenizer is None:
            raise EngineError(f"model {loaded.model} has no tokenizer.json for text")
        return list(loaded.tokenizer.encode(text, add_special_tokens=first).ids) if text else []

    def raise_if_failed(self) -> None:
        if self._failed is not None:
            raise EngineError(f"{self.instance_id} failed: {self._failed}")

    def context_tokens(self, context_id: str) -> int:
        """Tokens in a filled context (EngineError when there is none by that id)."""
        loaded = self._loaded
        seq = None if loaded is None else loaded.runner.contexts.get(CONTEXT_PREFIX + context_id)
        if seq is None:
            raise EngineError(f"{self.instance_id} has no filled context {context_id!r}")
        return seq.length

    def abort(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            live = self._live.pop(request_id, None)
            if live is not None:
                self._later(_abort_call(live.runner_id))
                self._events.append(Aborted(request_id, self.clock.now_s(), "aborted"))
        self._wake.set()

    def swap_out(self, request_ids: Sequence[str]) -> None:
        raise EngineError("the native engine does not swap KV to CPU")

    def swap_in(self, request_ids: Sequence[str]) -> None:
        raise EngineError("the native engine does not swap KV to CPU")

    def load_model(self, model: str) -> None:
        if model not in self.config.models:
            raise EngineError(f"unknown model {model!r}; known: {', '.join(self.config.models)}")
        now = self.clock.now_s()
        for request_id in list(self._live):
            del self._live[request_id]
            self._events.append(Aborted(request_id, now, f"model swap to {model}"))
        self._pending.clear()
        self._loading, self._announce = model, True
        self._wake.set()

    def poll(self) -> list[EngineEvent]:
        return self._events.drain()

    async def wait_events(self, timeout_s: float, tokens_after_s: float = 0.0) -> bool:
        """Sleep until events are due (True) or `timeout_s` passed (False): EventBuffer.wait."""
        return await self._events.wait(timeout_s, tokens_after_s)

    # ------------------------------------------------------------------ requests

    def _ready_for(self, request: Request) -> _Loaded:
        loaded = self._loaded
        if self._failed is not None:
            raise EngineError(f"{self.instance_id} failed: {self._failed}")
        if self._loading is not None or loaded is None:
            raise EngineError(f"{self.instance_id} is not ready (state {self.observe().state})")
        if request.model != loaded.model:
            raise EngineError(f"{self.instance_id} serves {loaded.model}, not {request.model}")
        if request.id in self._live:
            raise EngineError(f"request {request.id} is already here")
        return loaded

    def _prompt_ids(self, request: Request, first: bool) -> list[int]:
        if request.prompt is None:
            return [self.config.filler_token_id] * request.prompt_tokens
        return self.tokenize(request.prompt, first)

    def _later(self, call: Callable[[NativeRunner], None]) -> None:
        """Apply `call` to the runner now, or after the step in flight."""
        if self._stepping or self._loaded is None:
            self._pending.append(call)
        else:
            self._apply(call)

    def _apply(self, call: Callable[[NativeRunner], None]) -> None:
        assert self._loaded is not None
        call(self._loaded.runner)

    def _view(self, live: LiveRequest) -> EngineRequest:
        request = live.request
        return EngineRequest(
            request.id,
            request.slo_class,
            live.prompt_tokens,
            live.max_tokens,
            len(live.output),
            live.first_token_at_s is not None,
        )

    # ------------------------------------------------------------------ the loop

    async def _run(self) -> None:
        try:
            while not self._closing:
                await self._turn()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the engine is gone: say so, and fail what it held
            self._fail(f"{type(exc).__name__}: {exc}")

    async def _turn(self) -> None:
        """Load a model, or run one step, or sleep until there is work."""
        if self._loading is not None:
            await self._load(self._loading)
            return
        loaded = self._loaded
        if loaded is None or not loaded.runner.has_work:
            self._wake.clear()
            await self._wake.wait()
            return
        self._stepping = True
        try:
            self._step = asyncio.ensure_future(asyncio.to_thread(loaded.runner.step))
            result = await asyncio.shield(self._step)
        finally:
            self._stepping, self._step = False, None
        if loaded is self._loaded and self._loading is None:
            self._steps += 1
            self._take(result.emitted, loaded)
            for call in self._pending:
                self._apply(call)
        self._pending.clear()

    def _fail(self, reason: str) -> None:
        now = self.clock.now_s()
        self._failed = reason
        self._loaded = None
        for request_id in list(self._live):
            del self._live[request_id]
            self._events.append(Aborted(request_id, now, f"engine failed: {reason}"))
        self._events.append(EngineFailed(now, reason))

    async def _load(self, model: str) -> None:
        started = self.clock.monotonic_s()
        path = self.config.models[model]
        self._loaded = None
        loaded = await asyncio.to_thread(self._build, model, path)
        if self._loading != model:
            return  # another load was asked for meanwhile
        self._loaded, self._loading = loaded, None
        for call in self._pending:
            self._apply(call)
        self._pending.clear()
        if self._announce:
            load_s = self.clock.monotonic_s() - started
            self._events.append(ModelLoaded(model, self.clock.now_s(), load_s))

    def _build(self, model: str, path: Path) -> _Loaded:
        checkpoint = load_checkpoint(path)
        config = self.config
        blocks = KvCache.blocks_fitting(
            checkpoint.shape, config.kv_cache_bytes(), config.block_size
        )
        runner_config = RunnerConfig.of(config, blocks)
        tokenizer_file = path / "tokenizer.json"
        tokenizer = Tokenizer.from_file(str(tokenizer_file)) if tokenizer_file.exists() else None
        return _Loaded(model, NativeRunner(checkpoint, runner_config), tokenizer)

    # ------------------------------------------------------------------ events

    def _take(self, emitted: Sequence[Emitted], loaded: _Loaded) -> None:
        now = self.clock.now_s()
        for token in emitted:
            request_id = token.seq_id.rsplit("#", 1)[0]
            live = self._live.get(request_id)
            if live is None or live.runner_id != token.seq_id:
                continue  # aborted during the step (and maybe submitted again since)
            live.output.append(token.token)
            if live.first_token_at_s is None:
                live.first_token_at_s = now
                self._events.append(FirstToken(request_id, now))
            text = decode(loaded.tokenizer, live.output)
            stop_at = live.stop_at(text)
            if stop_at >= 0:
                self._later(_abort_call(token.seq_id))
                self._finish(live, text[:stop_at], "stop", now)
            elif token.finish is not None:
                self._finish(live, text, token.finish.value, now)
            elif self._steps % self.config.stream_every_steps == 0:
                self._stream(live, text, now, final=False)

    def _stream(self, live: LiveRequest, text: str, now: float, final: bool) -> None:
        chunk = live.chunk(text, final)
        if chunk is not None:
            self._events.append(TokenChunk(live.request.id, now, chunk[0], chunk[1]))

    def _finish(self, live: LiveRequest, text: str, reason: str, now: float) -> None:
        self._stream(live, text, now, final=True)
        del self._live[live.request.id]
        assert live.first_token_at_s is not None
        self._events.append(
            RequestFinished(
                live.request.id,
                now,
                live.first_token_at_s,
                len(live.output),
                reason,
                text,
                live.prompt_tokens,
            )
        )


def _abort_call(request_id: str) -> Callable[[NativeRunner], None]:
    def call(runner: NativeRunner) -> None:
        runner.abort(request_id)

    return call


def _room_tokens(runner: NativeRunner) -> int:
    """The longest sequence (prompt and output) the runner takes."""
    config = runner.config
    return min(config.num_blocks * config.block_size, runner.model.shape.max_position_embeddings)
