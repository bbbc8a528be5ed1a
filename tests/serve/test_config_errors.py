"""Bad fleet files, secrets and scenario files fail through the CLI before anything starts,
with an error naming the file, the line and the field (or the setting and the variable), and
never repeating a secret."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from qlm.api import create_app
from qlm.cli import main
from qlm.clock import VirtualClock
from qlm.config import load_yaml_model
from qlm.config.serve_config import ControllerConfig, ServeConfig
from qlm.queue.memory import MemoryQueue
from qlm.serve.runtime import api_settings

ROOT = Path(__file__).parent.parent.parent
FLEET = (ROOT / "examples" / "fleet.yaml").read_text()
SCENARIO = (ROOT / "sims" / "wa-quick.yaml").read_text()
SECRET = "sk-supersecret-0123456789"
KEY_RULE = "a key must have 8 to 512 characters and no whitespace"
SUBMIT = "/v1/qlm/requests"


def line_of(text: str, needle: str) -> int:
    return next(i for i, s in enumerate(text.splitlines(), 1) if needle in s)


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run `qlm`, expect the usage-error status quickly (nothing was started), return stderr."""
    started = time.monotonic()
    rc = main(argv)
    assert rc == 2
    assert time.monotonic() - started < 10.0
    return capsys.readouterr().err


# (replace, with, expected "field: message" part); the line is the replaced text's line.
FLEET_CASES = [
    pytest.param(
        "gpu_type: A10, count: 2",
        "gpu_type: B200, count: 2",
        "fleet.instances.0.gpu_type: unknown gpu_type 'B200'",
        id="unknown-gpu",
    ),
    pytest.param(
        "model: vicuna-13b}",
        "model: llama-70b}",
        "fleet.instances.1.model: 'llama-70b' is not in models",
        id="unknown-model",
    ),
    pytest.param(
        "model: vicuna-13b}",
        "model: llama-x}",
        "fleet.instances.1.model: llama-x cannot run on 1 x A100 (no profile",
        id="no-profile",
    ),
    pytest.param(
        "id: a100-flex, gpu_type: A100",
        "id: a10, gpu_type: A100",
        "fleet.instances.2.id: instance id 'a10' is used twice",
        id="duplicate-id",
    ),
    pytest.param(
        "url: null ",
        "url: http://queue ",
        "queue.url: Value error, must start with memory://",
        id="queue-scheme",
    ),
    pytest.param(
        "engine: {kind: emulated, speedup: 1.0, seed: 0}",
        "engine: {kind: vllm, vllm: {models: {mistral-7b: /m}, max_num_seqs: 0}}",
        "engine.vllm.max_num_seqs: Input should be greater than or equal to 1",
        id="vllm-field",
    ),
    pytest.param(
        "  key_prefix: qlm",
        "  key_prefix: qlm\n  max_queued: 10\n  reserved_queued: 20",
        "queue.reserved_queued: reserved_queued (20) exceeds max_queued (10)",
        id="reserved-over-max",
    ),
    pytest.param(
        "  key_prefix: qlm",
        "  key_prefix: qlm\n  max_queued: 10\n  reserved_classes: [gold]",
        "queue.reserved_classes: 'gold' is not a class",
        id="reserved-class",
    ),
    pytest.param(
        "api: {host: 127.0.0.1, port: 8000}",
        "api: {host: 127.0.0.1, port: 8000, quota: {requests_per_s: -1}}",
        "api.quota.requests_per_s: Input should be greater than 0",
        id="quota",
    ),
    pytest.param(
        "api: {host: 127.0.0.1, port: 8000}",
        "api: {host: 127.0.0.1, port: 8000, keys: {team: short}}",
        None,  # the secret check below: inline keys are validated when the API starts
        id="inline-short-key",
    ),
]


@pytest.mark.parametrize(("old", "new", "expected"), FLEET_CASES)
@pytest.mark.parametrize("command", ["serve", "api"])
def test_bad_fleet_files_name_file_line_and_field(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    old: str,
    new: str,
    expected: str | None,
    command: str,
) -> None:
    assert old in FLEET
    text = FLEET.replace(old, new)
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    err = run_cli([command, "--config", str(path)], capsys)
    if expected is None:
        assert f"api.keys.team: key: Value error, {KEY_RULE}" in err
        assert "short" not in err
        return
    field = expected.split(":")[0]
    line = line_of(text, new.splitlines()[-1].strip())
    assert f"{path}:{line}: {expected}" in err, err
    assert field in err


def write_fleet(tmp_path: Path, api: str = "", queue: str = "") -> Path:
    text = FLEET.replace("api: {host: 127.0.0.1, port: 8000}", f"api: {{port: 0{api}}}")
    text = text.replace("  key_prefix: qlm", f"  key_prefix: qlm{queue}")
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    return path


def test_keys_file_errors_name_file_and_line_without_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QLM_API_KEYS", raising=False)
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"team-a: {SECRET}\nteam-b:\n  - {SECRET[:5]}\n")
    fleet = write_fleet(tmp_path, api=f", keys_file: {keys}")
    err = run_cli(["serve", "--config", str(fleet)], capsys)
    assert f"{keys}:3: tenant 'team-b': key: Value error, {KEY_RULE}" in err
    assert SECRET[:5] not in err.replace(str(tmp_path), "")
    keys.write_text(f"team-a: [{SECRET}\n")  # broken YAML: the parser would quote the line
    err = run_cli(["serve", "--config", str(fleet)], capsys)
    assert f"{keys}:" in err
    assert "invalid YAML" in err
    assert SECRET not in err
    missing = tmp_path / "nope.yaml"
    err = run_cli(
        ["serve", "--config", str(write_fleet(tmp_path, api=f", keys_file: {missing}"))], capsys
    )
    assert f"api.keys_file: cannot read {missing}" in err


def test_keys_from_the_environment_are_checked_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QLM_API_KEYS", f"{{team-a: {SECRET}, team-b: {SECRET}}}")
    err = run_cli(["serve", "--config", str(write_fleet(tmp_path))], capsys)
    assert "one key is given twice (tenants 'team-a' and 'team-b')" in err
    assert SECRET not in err
    monkeypatch.setenv("QLM_API_KEYS", "[a, b]")
    err = run_cli(["api", "--config", str(write_fleet(tmp_path))], capsys)
    assert "environment variable QLM_API_KEYS:1: must map tenants to keys" in err


def test_queue_secrets_that_are_missing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("QLM_TEST_QUEUE_URL", raising=False)
    monkeypatch.delenv("QLM_TEST_REDIS_PASSWORD", raising=False)
    fleet = write_fleet(tmp_path, queue="\n  url_env: QLM_TEST_QUEUE_URL")
    err = run_cli(["controller", "--config", str(fleet)], capsys)
    assert "queue.url_env: environment variable QLM_TEST_QUEUE_URL is not set" in err
    monkeypatch.setenv("QLM_TEST_QUEUE_URL", "redis://127.0.0.1:1/0")
    fleet = write_fleet(
        tmp_path, queue="\n  url_env: QLM_TEST_QUEUE_URL\n  password_env: QLM_TEST_REDIS_PASSWORD"
    )
    err = run_cli(["controller", "--config", str(fleet)], capsys)
    assert "queue.password_env: environment variable QLM_TEST_REDIS_PASSWORD is not set" in err
    fleet = write_fleet(
        tmp_path,
        queue=f"\n  url: rediss://127.0.0.1:1/0\n  ssl_ca_certs: {tmp_path / 'ca.pem'}",
    )
    err = run_cli(["agent", "--config", str(fleet), "--instance", "a10-0"], capsys)
    assert f"queue.ssl_ca_certs: {tmp_path / 'ca.pem'} is not a readable file" in err
    fleet = write_fleet(tmp_path, queue="\n  password_env: A\n  password_file: /x")
    err = run_cli(["serve", "--config", str(fleet)], capsys)
    assert f"{fleet}:{line_of(fleet.read_text(), 'password_file')}: queue.password_file:" in err


def test_unknown_agent_instances_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = run_cli(["agent", "--config", str(write_fleet(tmp_path)), "--instance", "h100-9"], capsys)
    assert (
        "--instance h100-9: not in the fleet; known: ['a10-0', 'a10-1', 'a100', 'a100-flex']" in err
    )


OLD_FLEET = """\
models:
  - {name: mistral-7b}
gpu_memory_gib: {cpu: 1}
instances:
  - {id: a10, gpu_type: A10, count: 2, model: mistral-7b}
"""
OLD_SNAPSHOT = """\
fleet:
  instances:
    - {id: a10, gpu_type: A10, loaded_model: mistral-7b, busy_s: 3}
  profiles:
    - {model: mistral-7b, gpu_type: A10, weight_gb: 13.5, kv_kib_per_token: 128,
       decode_batch_sizes: [1], decode_step_ms: [20], prefill_tokens_per_s: 8000,
       output_tokens_mean: 200, output_tokens_std: 100, load_s: 30}
requests:
  - {model: mistral-7b, slo_class: interactive, count: 1}
"""


@pytest.mark.parametrize(
    ("command", "text", "expected"),
    [
        pytest.param(
            "serve",
            OLD_FLEET,
            [
                (5, "instances: no longer read: moved to fleet.instances"),
                (3, "gpu_memory_gib: no longer read: moved to fleet.gpu_types"),
            ],
            id="fleet-file",
        ),
        pytest.param(
            "plan",
            OLD_SNAPSHOT,
            [
                (3, "fleet.instances.0.loaded_model: no longer read: renamed to model"),
                (3, "fleet.instances.0.busy_s: no longer read: a snapshot's busy_s is a top-level"),
                (5, "fleet.profiles.0.weight_gb: no longer read: the inline format is the profile"),
                (6, "fleet.profiles.0.decode_step_ms: no longer read"),
            ],
            id="snapshot",
        ),
    ],
)
def test_old_field_names_are_refused_saying_where_they_went(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    command: str,
    text: str,
    expected: list[tuple[int, str]],
) -> None:
    path = tmp_path / "old.yaml"
    path.write_text(text)
    err = run_cli(
        [command, "--config", str(path)] if command == "serve" else [command, str(path)], capsys
    )
    for line, message in expected:
        assert f"{path}:{line}: {message}" in err, err


SCENARIO_CASES = [
    pytest.param(
        "classes: {interactive: 1}",
        "classes: {gold: 1}",
        "workload.0.classes.gold: unknown SLO class",
        id="unknown-class",
    ),
    pytest.param(
        "count: 1500", "count: -5", "workload.0.count: Input should be greater", id="count"
    ),
    pytest.param(
        "process: backlog", "process: nope", "workload.1.arrivals: Input tag 'nope'", id="process"
    ),
    pytest.param(
        "{gpu_type: A10, count: 2, model: mistral-7b}",
        "{gpu_type: A10, count: 2, model: mistral-7b, bogus: 3}",
        "fleet.instances.0.bogus: Extra inputs are not permitted",
        id="extra-field",
    ),
    pytest.param(
        "rate_scale: 2.5", "rate_scale: 0", "rate_scale: Input should be greater", id="rate"
    ),
]


@pytest.mark.parametrize(("old", "new", "expected"), SCENARIO_CASES)
def test_bad_scenarios_name_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], old: str, new: str, expected: str
) -> None:
    assert old in SCENARIO
    text = SCENARIO.replace(old, new).replace("path: data/", f"path: {ROOT / 'sims' / 'data'}/")
    path = tmp_path / "scenario.yaml"
    path.write_text(text)
    out = tmp_path / "out"
    err = run_cli(
        ["simulate", str(path), "--policy", "fcfs", "--no-progress", "--out", str(out)], capsys
    )
    assert f"{path}:{line_of(text, new)}: {expected}" in err, err
    assert not out.exists()  # nothing ran


def test_a_scenario_that_is_not_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: x\n  bad: [\n")
    err = run_cli(["simulate", str(path)], capsys)
    assert f"{path}: invalid YAML" in err
    assert "line 2" in err


async def test_context_lengths_and_body_limit_come_from_the_fleet_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The models' context lengths and the body limit the API enforces are the fleet file's."""
    monkeypatch.delenv("QLM_API_KEYS", raising=False)
    text = FLEET.replace("api: {host: 127.0.0.1, port: 8000}", "api: {max_body_bytes: 40000}")
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    config = load_yaml_model(path, ServeConfig)
    app = create_app(api_settings(config), MemoryQueue(), VirtualClock(0.0))
    prompt = "word " * 4000  # 5,000 tokens by the default counter: over 4,096, under 8,192
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
        small = await c.post(
            SUBMIT, json={"kind": "completion", "model": "vicuna-13b", "prompt": prompt}
        )
        assert (small.status_code, small.json()["error"]["code"]) == (
            400,
            "context_length_exceeded",
        )
        assert "maximum context length is 4096 tokens" in small.json()["error"]["message"]
        big = await c.post(
            SUBMIT, json={"kind": "completion", "model": "mistral-7b", "prompt": prompt}
        )
        assert big.status_code == 202
        huge = await c.post(
            SUBMIT, json={"kind": "completion", "model": "m", "prompt": "x" * 40_001}
        )
        assert huge.status_code == 413


@pytest.mark.parametrize(
    "field", ["tick_s", "min_replan_interval_s", "published_members_per_instance"]
)
def test_controller_fields_that_moved_to_qlm_control_are_refused_with_where(field: str) -> None:
    with pytest.raises(ValidationError, match=f"moved to qlm.control.{field}"):
        ControllerConfig.model_validate({field: 1})
