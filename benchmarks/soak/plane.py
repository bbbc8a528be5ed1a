"""The plane under soak: examples/fleet.yaml on a throwaway Redis with a bounded queue and sped-up
emulated engines, run as `qlm api` + `qlm controller` + `qlm agent`, or as `qlm serve`."""

from __future__ import annotations

from pathlib import Path

import yaml

from benchmarks.common.plane import Proc, example_fleet, instance_ids, start_qlm
from benchmarks.soak.options import SoakOptions
from tests.redis_server import free_port


def fleet_file(redis_url: str, opts: SoakOptions, path: Path) -> Path:
    """examples/fleet.yaml on the throwaway Redis, bounded, with sped-up emulated engines."""
    data = example_fleet()
    data["queue"] = {
        "url": redis_url,
        "key_prefix": "soak:",
        "max_queued": opts.max_queued,
        "reserved_queued": opts.reserved_queued,
    }
    data["api"] = {"host": "127.0.0.1", "port": 0, "completion_timeout_s": 120}
    data["engine"] = {**data.get("engine", {}), "speedup": opts.speedup}
    data["metrics"] = {"host": "127.0.0.1", "port": 0}  # several processes on one host
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def start_plane(setup: str, config: Path, log_dir: Path) -> list[Proc]:
    """The processes of a setup, the one serving HTTP first."""
    if setup == "serve":
        return [start_qlm(["serve"], config, log_dir, free_port())]
    agent_args = ["agent"]
    for instance in instance_ids(config):
        agent_args += ["--instance", instance]
    return [
        start_qlm(["api"], config, log_dir, free_port()),
        start_qlm(["controller"], config, log_dir),
        start_qlm(agent_args, config, log_dir),
    ]
