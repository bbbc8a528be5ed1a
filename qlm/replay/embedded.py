"""The plane `qlm replay --embedded` starts: the scenario's fleet on emulated engines, `qlm serve`
in a process of its own (the in-memory queue), every time scaled by the speedup.

The plane must see the scenario as the simulator does, only `speedup` times faster, and be
right about it: so the profiles themselves are scaled (`scaled_profile`: every step, prefill,
load and wake time divided by the speedup) and written into the fleet file, the emulated
engines follow them on the wall clock (the same engine model the simulator runs), and the
planner, the estimator and the dispatch decision price work with the same scaled profiles.
(Engines run faster than the profiles the plane prices with would make every load look four
times longer than it is against deadlines four times shorter: no swap would ever pay.) Every
other time the policy reads is divided too: SLO targets, the planner's time limit, the control
loop's tick and re-plan interval, the agents' poll and status periods. Not the planner's: it
gets the simulator's work budget (CP-SAT's deterministic work, as `qlm simulate` runs it) and
its unscaled time limit, so it finds the plans the simulator finds; a solve then takes up to
`speedup` times longer in scenario time than the latency the simulator charges (with a
quarter of the budget, at 4x on two cores, the live planner proposed the swaps of a burst
seconds later than the simulator and kept 4 points fewer promises). Each request generates
exactly its `max_tokens` (the scenario's true output length, `engine.output_length: cap`).
What cannot be scaled is the plane's own CPU time per decision: at a high speedup it weighs
more than in the deployed plane (keep the speedup at 4 or below on a small machine). For the
same reason the engines stream tokens in chunks every `STREAM_INTERVAL_S` (the first token at
once, as always): at the emulated engine's default of 20 chunks a second per request, a replay
of wc-quick (50 requests a second, well over 1,000 streams open at once) spent much of both cores
on chunks (parsing them in the openai client, writing them to the queue's streams and the
API's SSE), and its requests reached the plane late (`send_lag_p99_s`, `admission_lag_p99_s`;
the client's former cap on open streams, qlm/replay/sender.py, did the rest). Chunking
changes no decision: the agents read the engine's state, not the stream. The engines keep the
scenario's standby tier (`engine.standby_models`; before, replays of many-model scenarios ran
without it, so a model the simulator woke in a second the plane loaded cold: `many:0`, 11 swaps
live against 181 simulated).
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import yaml

from qlm.config import ConfigError
from qlm.config.profile_files import ProfileFile
from qlm.perf.profile import Profile
from qlm.perf.step import StepTime
from qlm.sim.scenario import Scenario
from qlm.types import Request

QLM_MAIN = "import sys; from qlm.cli import main; sys.exit(main())"
READY_TIMEOUT_S = 120.0
STREAM_INTERVAL_S = 0.5  # engine (= wall) seconds between a stream's chunks


def embedded_config(
    scenario: Scenario, requests: Sequence[Request], speedup: float, port: int
) -> dict[str, Any]:
    """A fleet file (as a dict) serving the scenario on emulated engines at `speedup`."""
    if not speedup > 0:
        raise ValueError("speedup must be > 0")
    qlm: dict[str, Any] = scenario.config.model_dump(mode="json")
    for slo in qlm["slo_classes"]:
        slo["ttft_s"] /= speedup
        if slo.get("completion_s") is not None:
            slo["completion_s"] /= speedup
    planner = qlm["planner"]
    if planner["backend"] == "cpsat" and planner.get("deterministic_work") is None:
        # the simulator's solve: the same work budget (qlm/sim/policies/qlm.py _reproducible)
        planner["deterministic_work"] = planner["time_limit_s"]
    control = qlm["control"]
    control["tick_s"] /= speedup
    control["min_replan_interval_s"] /= speedup
    if control.get("prefill_backlog_s") is not None:  # seconds of prefill, scaled as well
        control["prefill_backlog_s"] /= speedup
    context: dict[str, int] = {}
    for request in requests:
        need = request.prompt_tokens + request.max_output_tokens
        context[request.model] = max(context.get(request.model, 16), need)
    models = [{"name": m, "max_context_tokens": context.get(m, 8192)} for m in scenario.models]
    fleet = scenario.fleet_config.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    fleet.pop("profile_files", None)
    fleet["packaged_profiles"] = False
    fleet["profiles"] = [
        ProfileFile.of(scaled_profile(p, speedup)).model_dump(mode="json", exclude_none=True)
        for p in scenario.fleet().profiles.values()
    ]
    return {
        "qlm": qlm,
        "queue": {"url": None},
        "api": {"host": "127.0.0.1", "port": port, "max_deadline_s": 7 * 24 * 3600},
        "agent": {"poll_s": 0.25 / speedup, "status_every_s": 0.5 / speedup},
        "engine": {
            "kind": "emulated",
            "speedup": 1.0,
            "seed": 0,
            "output_length": "cap",
            "stream_interval_s": STREAM_INTERVAL_S,
            "standby_models": _standby_models(scenario),
        },
        "models": models,
        "fleet": fleet,
    }


def _standby_models(scenario: Scenario) -> int:
    """The scenario's standby tier, which the emulated engines keep as the simulated ones do.
    The rest of the scenario's `engine:` (the scheduler's settings) the fleet file cannot
    give the emulated engines: a scenario that sets any is refused, not replayed on another
    engine than the one simulated."""
    engine = scenario.engine
    others = sorted(engine.model_fields_set - {"standby_models"})
    if others:
        raise ConfigError(
            f"{scenario.name}: the embedded plane's engines cannot take engine.{others[0]} "
            "(only engine.standby_models); replay it against a plane configured alike (--url)"
        )
    return engine.standby_models


def scaled_profile(profile: Profile, speedup: float) -> Profile:
    """The profile of an engine `speedup` times faster: every time divided by it."""
    step = profile.step_time
    scaled_step = None
    if step is not None:
        scaled_step = StepTime(
            step.base_s / speedup,
            step.per_prefill_token_s / speedup,
            step.per_decode_seq_s / speedup,
            step.per_context_token_s / speedup,
        )
    return replace(
        profile,
        decode_step_s=tuple(s / speedup for s in profile.decode_step_s),
        prefill_tokens_per_s=profile.prefill_tokens_per_s * speedup,
        load_s=profile.load_s / speedup,
        wake_s=None if profile.wake_s is None else profile.wake_s / speedup,
        step_time=scaled_step,
        provenance=f"{profile.provenance} [times / {speedup:g}: qlm replay --embedded]",
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def embedded_plane(config: dict[str, Any], folder: Path) -> Iterator[str]:
    """`qlm serve` on `config` (written to folder/fleet.yaml, its log to folder/serve.log)
    until the block ends; yields its base URL once /readyz answers."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "fleet.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    url = f"http://127.0.0.1:{config['api']['port']}"
    with (folder / "serve.log").open("wb") as log:
        argv = [sys.executable, "-c", QLM_MAIN, "serve", "--config", str(path)]
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_ready(url, proc)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"qlm serve exited with status {proc.returncode} before ready")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=2.0, trust_env=False).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"qlm serve at {url} not ready after {READY_TIMEOUT_S:.0f} s")
