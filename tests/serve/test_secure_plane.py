"""A secured plane end to end on a real redis-server: the Redis password comes from a file
(a mounted Secret), API keys from a keys file and the environment, the tenant's queue bound
holds across the Redis scripts, and the openai client works with a key. TLS settings reach
the Redis client (rediss:// with a CA file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from qlm.config.serve_config import ServeConfig
from qlm.queue.redis import RedisQueue
from qlm.serve.runtime import open_queue, running_plane
from tests.factories import make_request
from tests.redis_server import RedisServer, redis_server_binary
from tests.serve.test_plane import PROFILE

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
KEY_A, KEY_B = "sk-team-a-0123456789", "sk-team-b-9876543210"


@pytest.fixture
def redis_with_password() -> Any:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    with RedisServer(password="hunter2-redis") as server:
        yield server


def secured(tmp_path: Path, port: int, **queue: Any) -> ServeConfig:
    password = tmp_path / "redis-password"
    password.write_text("hunter2-redis\n")  # as a Secret mounts it, with a newline
    keys = tmp_path / "keys.yaml"
    keys.write_text(f"team-a: [{KEY_A}]\n")
    return ServeConfig.model_validate(
        {
            "qlm": {"planner": {"policy": "edf"}, "control": {"tick_s": 0.05}},
            "queue": {
                "url": f"redis://127.0.0.1:{port}/0",
                "password_file": str(password),
                "key_prefix": "secure:",
                **queue,
            },
            "api": {"port": 0, "keys_file": str(keys)},
            "agent": {"poll_s": 0.01},
            "engine": {"kind": "emulated", "output_length": "cap"},
            "models": [{"name": "m-a"}],
            "fleet": {
                "packaged_profiles": False,
                "profiles": [{"model": "m-a", **PROFILE}],
                "instances": [{"id": "a100", "gpu_type": "A100", "model": "m-a"}],
            },
        }
    )


async def test_keys_password_and_tenant_bounds_on_redis(
    tmp_path: Path, redis_with_password: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QLM_API_KEYS", f"team-b: {KEY_B}")
    config = secured(tmp_path, redis_with_password.port, max_queued_per_tenant=2)
    async with running_plane(config, agents=False, controller=False) as plane:
        base = f"http://127.0.0.1:{plane.port}"
        async with httpx.AsyncClient(base_url=base) as client:
            body = {"kind": "completion", "model": "m-a", "prompt": "x", "slo_class": "batch-2"}
            as_a = {"authorization": f"Bearer {KEY_A}"}
            as_b = {"authorization": f"Bearer {KEY_B}"}  # from the environment
            submit = "/v1/qlm/requests"
            ids = []
            for _ in range(2):
                resp = await client.post(submit, json=body, headers=as_a)
                assert resp.status_code == 202
                ids.append(resp.json()["id"])
            full = await client.post(submit, json=body, headers=as_a)
            assert (full.status_code, full.json()["error"]["code"]) == (429, "tenant_queue_full")
            assert (await client.post(submit, json=body, headers=as_b)).status_code == 202
            assert (await client.post(submit, json=body)).status_code == 401
            for rid in ids:  # only team-a may cancel its requests: that frees its places
                assert (await client.delete(f"{submit}/{rid}", headers=as_b)).status_code == 404
                assert (await client.delete(f"{submit}/{rid}", headers=as_a)).status_code == 200
    async with running_plane(config) as plane:  # now with the controller and an agent
        oai = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{plane.port}/v1", api_key=KEY_A, max_retries=0
        )
        reply = await oai.completions.create(model="m-a", prompt="hello", max_tokens=3)
        assert reply.usage is not None
        assert reply.usage.completion_tokens == 3
        record = await plane.queue.get(reply.id)
        assert record is not None
        assert record.request.tenant == "team-a"
        await oai.close()


async def test_rediss_with_the_ca_file_from_the_fleet_file(tmp_path: Path) -> None:
    if redis_server_binary() is None:
        pytest.skip("redis-server is not installed")
    with RedisServer(tls=True, password="tls-pass") as server:
        config = secured(tmp_path, server.port, ssl_ca_certs=server.ca_file)
        config = config.model_copy(
            update={
                "queue": config.queue.model_copy(
                    update={"url": f"rediss://127.0.0.1:{server.port}/0"}
                )
            }
        )
        (tmp_path / "redis-password").write_text("tls-pass")
        queue = open_queue(config)
        assert isinstance(queue, RedisQueue)
        await queue.enqueue(make_request(id="r1"))
        assert [r.id for r in await queue.queued()] == ["r1"]
        await queue.close()
