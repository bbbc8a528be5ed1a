"""`qlm replay SCENARIO.yaml (--url URL | --embedded) [--speedup N] [--seed S] [--out DIR]`:
send a scenario's requests to a QLM at their arrival times through the public API, write
requests.csv and summary.json in the simulator's schema, and compare with `qlm simulate` on
the same requests (compare.json, and the table on stdout)."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from qlm.config import ConfigError
from qlm.replay.compare import comparison, comparison_table
from qlm.replay.embedded import embedded_config, embedded_plane, free_port
from qlm.replay.outcomes import live_result, swaps_by_instance
from qlm.replay.sender import Sender, Sent, raise_open_files_limit
from qlm.sim.result import SimResult
from qlm.sim.scenario import Scenario, load_scenario
from qlm.types import Request

DEFAULT_EMBEDDED_SPEEDUP = 4.0


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("replay", help="send a scenario's requests to a QLM; compare with simulate")
    p.add_argument("scenario", type=Path, help="scenario YAML (or random:SEED)")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running QLM's base URL (http://host:port)")
    where.add_argument(
        "--embedded", action="store_true", help="start `qlm serve` on emulated engines for it"
    )
    p.add_argument("--speedup", type=float, help="time runs N times faster (embedded: 4)")
    p.add_argument("--seed", type=int, help="workload seed (default: the scenario's)")
    p.add_argument("--out", type=Path, help="output folder (default replay-out/<scenario>)")
    p.add_argument("--api-key", default="unused", help="bearer key for a plane with keys")
    p.add_argument(
        "--stream-below-s",
        type=float,
        default=30.0,
        help="classes with a TTFT target below this (scenario seconds) stream; others go async",
    )
    p.add_argument("--policy", default="qlm", help="simulated policy to compare with")
    p.add_argument("--no-compare", action="store_true", help="do not run the simulator")
    p.set_defaults(handler=_replay_command)


@dataclass(frozen=True, slots=True)
class ReplayConfig:
    """Where and how a replay runs (the command's flags)."""

    url: str | None = None  # None: an embedded plane on emulated engines
    speedup: float = 1.0
    api_key: str = "unused"
    stream_below_s: float = 30.0
    policy: str = "qlm"  # the simulated policy compared with
    compare: bool = True


def _replay_command(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario)
    speedup = args.speedup or (DEFAULT_EMBEDDED_SPEEDUP if args.embedded else 1.0)
    if not (speedup > 0 and math.isfinite(speedup)):
        raise ConfigError(f"--speedup: must be a positive number, got {speedup}")
    seed = scenario.seed if args.seed is None else args.seed
    out: Path = args.out or Path("replay-out") / scenario.name
    options = ReplayConfig(
        None if args.embedded else args.url,
        speedup,
        args.api_key,
        args.stream_below_s,
        args.policy,
        not args.no_compare,
    )
    doc = run_replay(scenario, seed, options, out)
    if doc is None:
        print(f"wrote {out}/requests.csv and {out}/summary.json")
        return 0
    print(comparison_table(doc), flush=True)
    print(f"wrote {out}/requests.csv, {out}/summary.json and {out}/compare.json")
    return 0


def run_replay(
    scenario: Scenario, seed: int, options: ReplayConfig, out: Path
) -> dict[str, Any] | None:
    """Replay the scenario's requests for `seed`; write requests.csv, summary.json and
    records.jsonl into `out`, and, when comparing, compare.json: returned as a dict."""
    out.mkdir(parents=True, exist_ok=True)
    requests = scenario.requests(seed)
    live = replay(scenario, requests, seed, options, out)
    _write(out, scenario, seed, [live])
    if not options.compare:
        return None
    simulated = simulate_same(scenario, requests, seed, options.policy)
    targets = {c.name: c.ttft_s for c in scenario.slo_classes}
    doc = comparison(live, simulated, targets)
    doc.update(scenario=scenario.name, seed=seed, speedup=options.speedup)
    (out / "compare.json").write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    return doc


def replay(
    scenario: Scenario, requests: list[Request], seed: int, options: ReplayConfig, out: Path
) -> SimResult:
    """Send the requests (to `options.url`, or to an embedded plane) and read their outcomes."""
    drain_s = _drain_wall_s(scenario, requests, options.speedup)
    raise_open_files_limit()  # before the embedded plane starts: it inherits the limit
    if options.url is None:
        config = embedded_config(scenario, requests, options.speedup, free_port())
        with embedded_plane(config, out / "plane") as url:
            return _send(url, requests, seed, scenario, options, drain_s, out)
    return _send(options.url, requests, seed, scenario, options, drain_s, out)


def _send(
    url: str,
    requests: list[Request],
    seed: int,
    scenario: Scenario,
    options: ReplayConfig,
    drain_s: float,
    out: Path,
) -> SimResult:
    speedup = options.speedup

    async def go() -> SimResult:
        sender = Sender(url, speedup, options.stream_below_s, options.api_key)
        started = time.monotonic()
        try:
            sent = await sender.run(requests, drain_s)
        finally:
            await sender.close()
        wall_s = time.monotonic() - started
        async with httpx.AsyncClient(timeout=30.0, trust_env=False) as http:
            metrics = (await http.get(f"{url.rstrip('/')}/metrics")).text
        _write_records(out, sent)
        classes = [c.name for c in scenario.slo_classes]
        return live_result(sent, speedup, seed, classes, swaps_by_instance(metrics), wall_s)

    return asyncio.run(go())


def _drain_wall_s(scenario: Scenario, requests: list[Request], speedup: float) -> float:
    """How long to wait for the last requests after the last send, in wall seconds: until the
    scenario's horizon (where the simulator stops too), else the longest TTFT target plus
    a minute of output, scenario time."""
    last_s = max((r.arrival_at_s for r in requests), default=0.0)
    if scenario.horizon_s:
        return max(1.0, (scenario.horizon_s - last_s) / speedup)
    longest_s = max((c.ttft_s for c in scenario.slo_classes), default=60.0)
    return (longest_s + 60.0) / speedup


def simulate_same(scenario: Scenario, requests: list[Request], seed: int, policy: str) -> SimResult:
    """`qlm simulate`'s run of `policy` on these requests."""
    from qlm.sim.simulate import SimConfig, SimulatedEngines, simulate

    options = SimConfig(max_time_s=scenario.horizon_s or math.inf)
    engines = SimulatedEngines(scenario.engine)
    return simulate(
        scenario.fleet(),
        requests,
        policy,
        scenario.config,
        seed,
        options=options,
        engine_factory=engines,
    )


def _write_records(out: Path, sent: list[Sent]) -> None:
    """records.jsonl: per request, the scenario's id, the client's view and the queue's record."""
    with (out / "records.jsonl").open("w", encoding="utf-8") as f:
        for s in sent:
            line: dict[str, object] = {"id": s.request.id, "server_id": s.server_id}
            line.update(error=s.error, sent_at_s=s.sent_at_s, first_chunk_at_s=s.first_chunk_at_s)
            line.update(estimated_wait_s=s.estimated_wait_s, estimate_basis=s.estimate_basis)
            line.update(estimated_wait_p90_s=s.estimated_wait_bound_s)
            line.update(record=dict(s.record))
            f.write(json.dumps(line, separators=(",", ":")) + "\n")


def _write(out: Path, scenario: Scenario, seed: int, results: list[SimResult]) -> None:
    from qlm.sim.report import summary_document, write_json, write_requests_csv

    write_requests_csv(out / "requests.csv", results)
    write_json(out / "summary.json", summary_document(scenario.name, seed, results))
