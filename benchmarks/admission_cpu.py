"""API CPU per admission, with and without the wait forecast: how much the dispatch decision's
forecast (qlm/api/wait_forecast.py, one schedule of the request's model per admission) adds to
what admitting a request costs the API process.

    .venv/bin/python -m benchmarks.admission_cpu                 # wa-quick, 2,500 admissions
    .venv/bin/python -m benchmarks.admission_cpu --scenario sims/wc-quick.yaml --requests 1000

The scenario's requests, in arrival order, are posted to the asynchronous API (`POST
/v1/qlm/requests`, 202) of an app built in this process on the in-memory queue, through
httpx's ASGI transport (no sockets, so the figure is the app's own work plus the client's
small share), with every instance of the scenario's fleet reported serving its model; nothing
pulls them, so the queue grows to `--requests`. CPU is the process's (user + system) over the
admissions, divided by their number; alternating rounds, the median reported.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from benchmarks.report import (
    RESULTS_DIR,
    finish_header,
    header_lines,
    run_header,
    write_docs_block,
    write_results,
)
from qlm.api import ApiAppConfig, create_app
from qlm.api.wait_forecast import QueueForecaster
from qlm.clock import WallClock
from qlm.queue.memory import MemoryQueue
from qlm.queue.records import InstanceStatus
from qlm.sim.scenario import Scenario, load_scenario

ROOT = Path(__file__).resolve().parent.parent


async def admissions(scenario: Scenario, count: int, forecast: bool) -> dict[str, Any]:
    """CPU ms per admission of the scenario's first `count` requests, and their bases."""
    requests = scenario.requests(scenario.seed)[:count]
    fleet = scenario.fleet()
    classes = scenario.config.slo_classes
    settings = ApiAppConfig.model_validate(
        {
            "models": [{"name": m} for m in sorted({r.model for r in requests})],
            "slo_classes": [c.model_dump() for c in classes],
            "default_slo_class": classes[0].name,
        }
    )
    queue, clock = MemoryQueue(), WallClock()
    for instance in fleet.instances:
        status = InstanceStatus(
            instance_id=instance.id, state="ready", model=instance.loaded_model, busy_s=0.0,
            running=0, kv_used_tokens=0, kv_capacity_tokens=1, at_s=clock.now_s(),
        )  # fmt: skip
        await queue.report_instance(status)
    priority = {c.name: c.priority for c in classes}
    forecaster = QueueForecaster(queue, fleet, priority, clock, 1.0, 0.5) if forecast else None
    app = create_app(settings, queue, clock, forecaster=forecaster)
    bases: dict[str, int] = {}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://qlm") as client:
        start = time.process_time()
        for request in requests:
            body = {"kind": "completion", "model": request.model, "prompt": "x" * 64}
            headers = {"x-qlm-slo-class": request.slo_class}
            answer = await client.post("/v1/qlm/requests", json=body, headers=headers)
            if answer.status_code != 202:
                raise RuntimeError(f"HTTP {answer.status_code}: {answer.text[:200]}")
            basis = answer.headers.get("x-qlm-estimate-basis", "")
            bases[basis] = bases.get(basis, 0) + 1
        cpu_s = time.process_time() - start
    return {"cpu_ms_per_admission": 1000 * cpu_s / len(requests), "bases": bases}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", type=Path, default=ROOT / "sims" / "wa-quick.yaml")
    parser.add_argument("--requests", type=int, default=2500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=RESULTS_DIR / "admission_cpu.json")
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    header = run_header("admission_cpu.py", sys.argv[1:] if argv is None else argv, "shared")
    scenario = load_scenario(args.scenario)
    runs: dict[str, list[dict[str, Any]]] = {"plan only": [], "with forecast": []}
    for _ in range(args.rounds):
        for name in runs:
            forecast = name == "with forecast"
            runs[name].append(asyncio.run(admissions(scenario, args.requests, forecast)))
    finish_header(header)
    median = {n: statistics.median(r["cpu_ms_per_admission"] for r in rs) for n, rs in runs.items()}
    lines = [
        "## API CPU per admission, with and without the wait forecast",
        "",
        *header_lines(header),
        "",
        f"{args.requests} requests of {scenario.name} (seed {scenario.seed}) posted to the "
        "asynchronous API in arrival order, nothing pulling them; CPU of the process per "
        f"admission, median of {args.rounds} alternating rounds.",
        "",
        "| wait estimate | CPU ms per admission | rounds | estimate bases (last round) |",
        "|---|---|---|---|",
        *(
            f"| {name} | {median[name]:.2f} | "
            + ", ".join(f"{r['cpu_ms_per_admission']:.2f}" for r in rs)
            + f" | {rs[-1]['bases']} |"
            for name, rs in runs.items()
        ),
        "",
        f"The forecast adds {median['with forecast'] - median['plan only']:.2f} ms per admission.",
    ]
    print("\n".join(lines))
    if not args.no_docs:
        write_docs_block("admission-cpu", "\n".join(lines))
    plain_args = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    write_results(args.out, {"header": header, "args": plain_args, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
