"""Subcommands of `qlm` for the live control plane (see qlm/cli.py):

qlm serve --config FLEET.yaml        API, controller and agents in one process
qlm api --config FLEET.yaml          the API alone (N replicas behind a Service)
qlm controller --config FLEET.yaml   the control loop alone (leader-elected)
qlm agent --config FLEET.yaml --instance ID [--instance ID ...]
qlm demo --config FLEET.yaml         the main job: serve, drive a mixed load, print attainment
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from pathlib import Path

from qlm.config import load_yaml_model
from qlm.config.serve_config import ServeConfig


def add_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parts = {
        "serve": ("API, controller and agents in one process", {}),
        "api": ("the HTTP API alone", {"controller": False, "agents": False}),
        "controller": ("the control loop alone", {"api": False, "agents": False}),
    }
    for name, (help_text, only) in parts.items():
        p = _with_config(sub.add_parser(name, help=help_text))
        if only.get("api") is False:
            _with_metrics_port(p)
        p.set_defaults(handler=lambda a, only=only: _serve(a, **only))
    agent = _with_metrics_port(
        _with_config(sub.add_parser("agent", help="agents for some instances"))
    )
    agent.add_argument("--instance", action="append", required=True, help="instance id")
    agent.set_defaults(handler=lambda a: _serve(a, api=False, controller=False, agents=a.instance))
    demo = _with_config(sub.add_parser("demo", help="serve, drive a mixed load, print attainment"))
    demo.add_argument("--duration", type=float, default=20.0, help="seconds of interactive load")
    demo.add_argument("--interactive-rps", type=float, default=2.0)
    demo.add_argument("--batch1", type=int, default=60, help="batch-1 requests submitted up front")
    demo.add_argument("--batch2", type=int, default=300, help="batch-2 requests submitted up front")
    demo.set_defaults(handler=_demo)


def _with_config(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--config", type=Path, required=True, help="fleet YAML")
    parser.add_argument("--port", type=int, help="override api.port")
    parser.add_argument("--log-level", default="WARNING")
    return parser


def _with_metrics_port(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Processes without the API serve /metrics on a port of their own."""
    parser.add_argument(
        "--metrics-port", type=_port, help="override metrics.port (default 9400): /metrics here"
    )
    return parser


def _port(text: str) -> int:
    port = int(text)
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port (0-65535)")
    return port


def _load(args: argparse.Namespace) -> ServeConfig:
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(message)s")
    config = load_yaml_model(args.config, ServeConfig)
    if args.port is not None:
        config = config.model_copy(
            update={"api": config.api.model_copy(update={"port": args.port})}
        )
    if getattr(args, "metrics_port", None) is not None:
        metrics = config.metrics.model_copy(update={"port": args.metrics_port})
        config = config.model_copy(update={"metrics": metrics})
    return config


def _serve(args: argparse.Namespace, **parts: object) -> int:
    import uvloop

    from qlm.serve.runtime import serve_forever

    # uvloop: the event loop uvicorn picks by itself when it owns the process.
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(serve_forever(_load(args), **parts))  # type: ignore[arg-type]
    return 0


def _demo(args: argparse.Namespace) -> int:
    from qlm.serve.demo import DemoLoad, main_demo

    load = DemoLoad(
        duration_s=args.duration,
        interactive_rps=args.interactive_rps,
        batch1_requests=args.batch1,
        batch2_requests=args.batch2,
    )
    return main_demo(_load(args), load)
