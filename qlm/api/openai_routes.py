"""OpenAI-compatible routes: /v1/models, /v1/completions, /v1/chat/completions."""

from __future__ import annotations

import logging

from fastapi import FastAPI
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from qlm.api.context import REQUEST_ID_HEADER, ApiContext, admitted_headers, json_response
from qlm.api.errors import ApiError
from qlm.api.formats import CHAT, COMPLETION, Head, OutputFormat, usage
from qlm.api.streaming import (
    ClientDisconnectedError,
    SseResponse,
    StreamJob,
    failure,
    final_result,
    is_completed,
    race_disconnect,
    sse_frames,
    timeout_error,
)
from qlm.api.views import model_card, model_list

log = logging.getLogger(__name__)
CLIENT_CLOSED = 499  # nginx's status for a request the client abandoned


def add_openai_routes(app: FastAPI, ctx: ApiContext) -> None:
    """Register the routes on `app` itself (an included router costs a second match)."""
    models = model_list(ctx.settings.model_map(), ctx.created)

    @app.get("/v1/models")
    async def list_models(http: HttpRequest) -> Response:
        ctx.authenticate(http)
        return json_response(models)

    @app.get("/v1/models/{model_id:path}")
    async def get_model(model_id: str, http: HttpRequest) -> Response:
        ctx.authenticate(http)
        return json_response(model_card(model_id, ctx.admitter.model(model_id), ctx.created))

    async def completions(http: HttpRequest) -> Response:
        return await generate(ctx, http, COMPLETION)

    async def chat_completions(http: HttpRequest) -> Response:
        return await generate(ctx, http, CHAT)

    # Plain Starlette routes: the handlers read and validate the body themselves, so FastAPI's
    # dependency solving would only add latency to the admission path (openapi.py documents
    # their bodies).
    app.add_route("/v1/completions", completions, methods=["POST"])
    app.add_route("/v1/chat/completions", chat_completions, methods=["POST"])


async def generate(ctx: ApiContext, http: HttpRequest, fmt: OutputFormat) -> Response:
    """Authenticate, validate, enqueue, then stream the tokens or wait for the whole result."""
    tenant = ctx.authenticate(http)
    body = await ctx.read(http, fmt.parse)
    request = await ctx.admit(body, http, fmt.id_prefix, tenant)
    head = Head(request.id, int(request.arrival_at_s), body.model)
    headers = admitted_headers(request)
    timeout_s = ctx.settings.api.completion_timeout_s
    if body.stream:
        job = StreamJob(ctx.queue, fmt, head, request.prompt_tokens, body.include_usage, timeout_s)
        return SseResponse(sse_frames(job), headers, lambda: ctx.cancel(request.id))
    try:
        finished = await race_disconnect(
            final_result(ctx.queue, request.id), http.receive, timeout_s
        )
    except TimeoutError:
        raise _with_id(timeout_error(request.id, timeout_s), request.id) from None
    except ClientDisconnectedError:
        await ctx.cancel(request.id)
        return Response(status_code=CLIENT_CLOSED, headers=headers)
    result = finished.result
    if result is None or not is_completed(result):
        raise _with_id(failure(result, request.id), request.id)
    data = fmt.response(
        head,
        finished.text,
        result.finish_reason,
        usage(result.prompt_tokens or request.prompt_tokens, result.output_tokens),
        result.extras,
    )
    return json_response(data, headers=headers)


def _with_id(error: ApiError, request_id: str) -> ApiError:
    error.headers[REQUEST_ID_HEADER] = request_id
    return error
