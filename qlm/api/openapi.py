"""The app's OpenAPI document, including the three POST routes.

The POST routes are plain Starlette routes that read and validate their bodies themselves
(see openai_routes.py: FastAPI's dependency solving would only add latency to admission), so
FastAPI cannot see their bodies. This module describes them from the same pydantic models the
handlers validate with, once, when /openapi.json is first asked for; admission never runs it.
It also names the served models and the configured SLO classes as the values `model` and
`slo_class` may take (others are refused), gives every operation the errors it really returns
(OpenAI's error object, 4XX/5XX) instead of FastAPI's 422, documents the SLO headers, and
declares bearer authentication when keys are configured.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import TypeAdapter

from qlm.api.schemas import ChatBody, CompletionBody, Submission
from qlm.api.slo import HEADER_CLASS, HEADER_LLMD_TTFT_MS, HEADER_TTFT_MS
from qlm.api.wait_estimate import BASIS_HEADER, WAIT_HEADER
from qlm.config.api_settings import ApiAppConfig

Json = dict[str, Any]
_REF = "#/components/schemas/{model}"

ERROR_SCHEMA: Json = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string", "minLength": 1},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}

_SLO_HEADERS: list[Json] = [
    {
        "name": HEADER_CLASS,
        "in": "header",
        "required": False,
        "description": "SLO class (the body's slo_class wins).",
        "schema": {"type": "string"},
    },
    *(
        {
            "name": header,
            "in": "header",
            "required": False,
            "description": "TTFT target in milliseconds (the body's slo_ttft_s wins).",
            "schema": {"type": "string"},
        }
        for header in (HEADER_TTFT_MS, HEADER_LLMD_TTFT_MS)
    ),
]

# One Server-Sent Event: `data` is a chunk's JSON text, or [DONE] at the end.
_SSE_EVENT: Json = {
    "type": "object",
    "required": ["data"],
    "properties": {"data": {"type": "string"}},
}

# path -> (summary, body type, success status, success description)
_POSTS: dict[str, tuple[str, Any, str, str]] = {
    "/v1/chat/completions": (
        "OpenAI chat completion (stream true: Server-Sent Events)",
        ChatBody,
        "200",
        "chat.completion, or chat.completion.chunk events when streaming",
    ),
    "/v1/completions": (
        "OpenAI text completion (stream true: Server-Sent Events)",
        CompletionBody,
        "200",
        "text_completion, or its chunks as events when streaming",
    ),
    "/v1/qlm/requests": (
        "Asynchronous submission of a chat or completion body (kind: chat | completion)",
        Submission,
        "202",
        "accepted: the request's id, state and deadlines",
    ),
}


_LIST_QUERY = {
    "state": ("Comma-separated states to keep (queued, dispatched, running, ...).", "string"),
    "limit": ("Requests per page, 1-100 (default 20).", "integer"),
    "after": ("The `next_cursor` of the previous page.", "string"),
}
_LIST_OPERATION: Json = {
    "summary": "The caller's requests, newest first (with authentication on: its own only)",
    "parameters": [
        {"name": n, "in": "query", "required": False, "description": d, "schema": {"type": t}}
        for n, (d, t) in _LIST_QUERY.items()
    ],
    "responses": {
        "200": {
            "description": "object: list; data: request records; has_more; next_cursor",
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    },
}
# Every answer to an admitted request carries its id and predicted wait (wait_estimate.py).
_ADMITTED_HEADERS: Json = {
    "x-qlm-request-id": {"schema": {"type": "string"}, "description": "the request's id"},
    WAIT_HEADER: {"schema": {"type": "string"}, "description": "predicted seconds to 1st token"},
    BASIS_HEADER: {
        "schema": {"type": "string", "enum": ["schedule", "late", "plan", "idle", "no-plan"]},
        "description": "what the predicted wait rests on",
    },
}


def install_openapi(app: FastAPI, settings: ApiAppConfig) -> None:
    """Replace app.openapi with one that documents the plain POST routes too."""

    def openapi() -> Json:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, summary=app.summary, routes=app.routes
            )
            app.openapi_schema = complete(schema, settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def complete(schema: Json, settings: ApiAppConfig) -> Json:
    """FastAPI's document plus the POST operations, real error responses and security."""
    bearer_auth = settings.auth_required
    models = sorted(settings.model_names)
    classes = [c.name for c in settings.slo_classes]
    components: Json = schema.setdefault("components", {})
    schemas: Json = components.setdefault("schemas", {})
    for name in ("HTTPValidationError", "ValidationError"):
        schemas.pop(name, None)
    schemas["Error"] = ERROR_SCHEMA
    paths: Json = schema.setdefault("paths", {})
    for path, (summary, body_type, status, description) in _POSTS.items():
        body = TypeAdapter(body_type).json_schema(ref_template=_REF)
        defs = body.pop("$defs", {})
        for part in (body, *defs.values()):
            _name_values(part, models, classes)
        schemas.update(defs)
        paths.setdefault(path, {})["post"] = _post_operation(summary, body, status, description)
    paths.setdefault("/v1/qlm/requests", {})["get"] = copy.deepcopy(_LIST_OPERATION)
    for path, operations in paths.items():
        for operation in operations.values():
            _real_errors(operation)
            if bearer_auth and path.startswith("/v1/"):
                operation["security"] = [{"bearer": []}]
    if bearer_auth:
        components["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
    return schema


def _name_values(body: Json, models: list[str], classes: list[str]) -> None:
    """The served models and configured classes as enums of a generation body's fields."""
    properties = body.get("properties", {})
    if "model" not in properties:
        return
    properties["model"] = {"type": "string", "enum": models, "title": "Model"}
    if "slo_class" in properties:
        properties["slo_class"] = {
            "anyOf": [{"type": "string", "enum": classes}, {"type": "null"}],
            "default": None,
            "title": "SLO class",
        }


def _post_operation(summary: str, body: Json, status: str, description: str) -> Json:
    content: Json = {"application/json": {"schema": {"type": "object"}}}
    if status == "200":
        content["text/event-stream"] = {"schema": _SSE_EVENT}
    return {
        "summary": summary,
        "parameters": list(_SLO_HEADERS),
        "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
        "responses": {
            status: {"description": description, "content": content, "headers": _ADMITTED_HEADERS}
        },
    }


def _real_errors(operation: Json) -> None:
    """Errors are OpenAI's error object: 4XX for the client's, 5XX for the server's."""
    responses: Json = operation.setdefault("responses", {})
    responses.pop("422", None)
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    responses["4XX"] = {"description": "the client's error (OpenAI error object)", "content": error}
    responses["5XX"] = {"description": "the server's error (OpenAI error object)", "content": error}
