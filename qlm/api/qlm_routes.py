"""QLM's own routes: asynchronous submission for batch work, request state and the caller's
request list, queue counts, liveness and readiness."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from pydantic import ValidationError
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from qlm.api.context import ApiContext, admitted_headers, json_response
from qlm.api.errors import SERVER_ERROR, ApiError, from_pydantic
from qlm.api.schemas import SUBMISSION, SUBMISSION_KINDS, ChatSubmission, CompletionSubmission
from qlm.api.views import accepted, queue_counts, record_view
from qlm.queue.listing import RecordFilter, RecordPage
from qlm.types import RequestState

REQUESTS = "/v1/qlm/requests"
DEFAULT_LIMIT = 20
MAX_LIMIT = 100
CURSOR_PREFIX = "seq-"  # cursors are opaque to clients; the prefix catches a pasted id


def parse_submission(raw: str) -> ChatSubmission | CompletionSubmission:
    """A completions or chat body chosen by its `kind`; errors name fields without the tag."""
    try:
        return SUBMISSION.validate_json(raw)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        if str(errors[0]["type"]).startswith("union_tag"):
            known = ", ".join(repr(k) for k in SUBMISSION_KINDS)
            raise ApiError(400, f"'kind' must be one of {known}.", param="kind") from None
        loc = errors[0]["loc"]
        raise from_pydantic(exc, skip=1 if loc and loc[0] in SUBMISSION_KINDS else 0) from None


def record_filter(query: Mapping[str, str], tenant: str | None) -> RecordFilter:
    """The page a listing asks for: `state` (comma-separated states), `limit` (1-100,
    default 20), `after` (the previous page's `next_cursor`); 400 naming a bad one. With
    authentication on, a caller sees only its own requests."""
    unknown = sorted(set(query) - {"state", "limit", "after"})
    if unknown:
        raise ApiError(400, f"Unknown query parameter {unknown[0]!r}.", param=unknown[0])
    return RecordFilter(
        tenant,
        _states(query.get("state", "")),
        _cursor(query.get("after")),
        _limit(query.get("limit", str(DEFAULT_LIMIT))),
    )


def _states(text: str) -> frozenset[RequestState]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    known = {str(state) for state in RequestState}
    for name in names:
        if name not in known:
            choices = ", ".join(sorted(known))
            raise ApiError(400, f"'state' must be among {choices}; got {name!r}.", param="state")
    return frozenset(RequestState(name) for name in names)


def _limit(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise ApiError(400, f"'limit' must be an integer from 1 to {MAX_LIMIT}.", param="limit")
    return int(text)


def _cursor(text: str | None) -> int | None:
    if text is None:
        return None
    if not text.startswith(CURSOR_PREFIX) or not text[len(CURSOR_PREFIX) :].isdigit():
        raise ApiError(400, "'after' must be a next_cursor of an earlier page.", param="after")
    return int(text[len(CURSOR_PREFIX) :])


def page_view(page: RecordPage) -> dict[str, Any]:
    cursor = page.next_before_seq
    return {
        "object": "list",
        "data": [record_view(record) for record in page.records],
        "has_more": cursor is not None,
        "next_cursor": None if cursor is None else f"{CURSOR_PREFIX}{cursor}",
    }


def add_qlm_routes(app: FastAPI, ctx: ApiContext) -> None:
    """Register the routes on `app` itself (an included router costs a second match)."""

    async def submit(http: HttpRequest) -> Response:
        tenant = ctx.authenticate(http)
        body = await ctx.read(http, parse_submission)
        if body.stream:
            raise ApiError(400, "Asynchronous requests do not stream.", param="stream")
        request = await ctx.admit(body, http, "req-", tenant)
        headers = {**admitted_headers(request), "location": f"{REQUESTS}/{request.id}"}
        return json_response(accepted(request, body.kind), 202, headers)

    async def list_requests(http: HttpRequest) -> Response:
        tenant = ctx.authenticate(http)
        page = record_filter(http.query_params, tenant)
        return json_response(page_view(await ctx.queue.list_records(page)))

    app.add_route(REQUESTS, submit, methods=["POST"])  # a plain route: see openai_routes.py
    app.add_route(REQUESTS, list_requests, methods=["GET"])

    @app.get(REQUESTS + "/{request_id}")
    async def get_request(request_id: str, http: HttpRequest) -> Response:
        tenant = ctx.authenticate(http)
        return json_response(record_view(await ctx.record(request_id, tenant)))

    @app.delete(REQUESTS + "/{request_id}")
    async def cancel_request(request_id: str, http: HttpRequest) -> Response:
        tenant = ctx.authenticate(http)
        record = await ctx.record(request_id, tenant)
        if not record.state.is_terminal and await ctx.cancel(request_id):
            return json_response(record_view(await ctx.record(request_id, tenant)))
        state = (await ctx.record(request_id, tenant)).state
        raise ApiError(409, f"Request {request_id} is already {state}.", code="request_terminal")

    @app.get("/v1/qlm/queue")
    async def counts(http: HttpRequest) -> Response:
        ctx.authenticate(http)
        return json_response(queue_counts(await ctx.queue.counts()))

    @app.get("/healthz")
    async def healthz() -> Response:
        return json_response({"status": "ok"})

    @app.get("/readyz")
    async def readyz() -> Response:
        try:
            await asyncio.wait_for(ctx.queue.counts(), ctx.settings.api.ready_timeout_s)
        except Exception as exc:
            raise ApiError(
                503, f"The queue is not reachable: {exc!r}", type=SERVER_ERROR, code="not_ready"
            ) from None
        return json_response({"status": "ready"})
