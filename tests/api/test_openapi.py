"""The OpenAPI document describes every route, the POST bodies included, and schemathesis
fuzzes the in-process app (ASGI, in-memory queue, a fake agent serving requests, keys on)
from it: no 5xx, every error in OpenAI's shape, authentication enforced."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    ignored_auth,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)

from qlm.api import create_app
from qlm.clock import VirtualClock
from qlm.config.api_settings import ApiKey
from qlm.queue.memory import MemoryQueue
from tests.api.conftest import NOW_S, make_settings
from tests.api.fake_agent import FakeAgent

KEY = "sk-fuzz-0123456789"
POSTS = ("/v1/chat/completions", "/v1/completions", "/v1/qlm/requests")
API_CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
    ignored_auth,
]


def fuzzed_app() -> FastAPI:
    """The app with keys configured and a fake agent started by its lifespan, so synchronous
    completions finish instead of timing out."""
    queue = MemoryQueue()
    clock = VirtualClock(NOW_S)
    app = create_app(
        make_settings(api_keys=(ApiKey(key=KEY, tenant="fuzz"),), completion_timeout_s=5.0),
        queue,
        clock,
    )

    @contextlib.asynccontextmanager
    async def with_agent(_: Any) -> AsyncIterator[None]:
        task = asyncio.create_task(FakeAgent(queue, clock).run())
        yield
        task.cancel()

    app.router.lifespan_context = with_agent
    return app


schema = schemathesis.openapi.from_asgi("/openapi.json", fuzzed_app())


@schema.auth()
class BearerKey:
    """The tenant's key on every generated request (the ignored_auth check probes without)."""

    def get(self, case: schemathesis.Case, ctx: schemathesis.AuthContext) -> str:
        return KEY

    def set(self, case: schemathesis.Case, data: str, ctx: schemathesis.AuthContext) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.mark.one_process  # one node id for every operation (tests/conftest.py)
@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=True,
)
def test_fuzzed_requests_get_no_5xx_and_openai_errors(case: schemathesis.Case) -> None:
    """Every route must never answer 5xx; the API routes (/v1, health) must also answer as
    documented: OpenAI error objects, declared statuses and media types, invalid data
    refused, and authentication enforced. Operator pages (/metrics, /dashboard) are only
    held to the first."""
    api_route = case.path.startswith("/v1/") or case.path in ("/healthz", "/readyz")
    case.call_and_validate(checks=API_CHECKS if api_route else [not_a_server_error])


async def test_post_routes_are_documented_with_their_bodies(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    components = document["components"]["schemas"]
    for path in POSTS:
        operation = document["paths"][path]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert "properties" in body or "oneOf" in body
        assert operation["responses"]["4XX"]["content"]["application/json"]["schema"] == {
            "$ref": "#/components/schemas/Error"
        }
        headers = {p["name"] for p in operation["parameters"] if p["in"] == "header"}
        assert {"x-qlm-slo-class", "x-qlm-slo-ttft-ms", "x-llm-d-slo-ttft-ms"} <= headers
    chat = document["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    chat_schema = chat["content"]["application/json"]["schema"]
    assert {"model", "messages"} <= set(chat_schema["required"])
    assert chat_schema["properties"]["max_tokens"]["anyOf"][0]["minimum"] == 1
    submission = document["paths"]["/v1/qlm/requests"]["post"]["requestBody"]
    assert submission["content"]["application/json"]["schema"]["discriminator"]["propertyName"] == (
        "kind"
    )
    assert {"ChatMessage", "ChatSubmission", "CompletionSubmission", "Error"} <= set(components)
    assert "HTTPValidationError" not in components  # errors are OpenAI's, never FastAPI's 422
    assert "securitySchemes" not in document["components"]  # no keys in the default app


def test_keys_declare_bearer_security() -> None:
    document = fuzzed_app().openapi()
    assert document["components"]["securitySchemes"] == {
        "bearer": {"type": "http", "scheme": "bearer"}
    }
    assert document["paths"]["/v1/completions"]["post"]["security"] == [{"bearer": []}]
    assert "security" not in document["paths"]["/healthz"]["get"]
