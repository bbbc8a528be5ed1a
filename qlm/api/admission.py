"""Admission: a validated body becomes a queued Request, or an ApiError saying why not.

Checks run in the order a client fixes them: body size and encoding, JSON and field types,
model, prompt length against the model's context, output cap, SLO tags. Nothing here touches
the queue, so a rejected request leaves the queue as it was.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

from pydantic import ValidationError
from starlette.requests import ClientDisconnect
from starlette.requests import Request as HttpRequest

from qlm.api.errors import ApiError, from_pydantic
from qlm.api.schemas import Body, ChatBody
from qlm.api.slo import SloResolver
from qlm.api.tokens import TokenCounter
from qlm.config.api_settings import ApiAppConfig, ModelConfig
from qlm.engine.openai_fields import CHAT_TEMPLATE_ENGINES, unsupported
from qlm.prefixes.prompt_blocks import prompt_prefix
from qlm.types import Request

T = TypeVar("T")


async def read_body(http: HttpRequest, limit_bytes: int) -> str:
    """The body as text: 413 beyond limit_bytes (checked before reading when the client
    declares its length), 400 when it is not UTF-8."""
    declared = http.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit_bytes:
        raise _too_large(limit_bytes)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in http.stream():
            size += len(chunk)
            if size > limit_bytes:
                raise _too_large(limit_bytes)
            chunks.append(chunk)
    except ClientDisconnect:
        raise ApiError(
            400, "The client disconnected before sending the whole body.", code="incomplete_body"
        ) from None
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(
            400, f"The body is not valid UTF-8 (byte {exc.start}).", code="invalid_utf8"
        ) from None


def _too_large(limit_bytes: int) -> ApiError:
    return ApiError(413, f"The request body exceeds {limit_bytes} bytes.", code="request_too_large")


def parse(parser: Callable[[str], T], raw: str) -> T:
    try:
        return parser(raw)
    except ValidationError as exc:
        raise from_pydantic(exc) from None


class Admitter:
    """Builds Requests from bodies: token counts, output caps and deadlines."""

    def __init__(self, settings: ApiAppConfig, counter: TokenCounter) -> None:
        self._models: Mapping[str, ModelConfig] = settings.model_map()
        self._counter = counter
        self._engine_kind = settings.engine_kind
        self._default_max_tokens = settings.api.default_max_tokens
        self._slo = SloResolver(
            settings.slo_class_map(), settings.default_slo_class, settings.api.max_deadline_s
        )

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` by the API's counter (what a prompt of it would count)."""
        return self._counter.count(text)

    def build(
        self,
        body: Body,
        headers: Mapping[str, str],
        request_id: str,
        now_s: float,
        tenant: str | None = None,
    ) -> Request:
        """The queued Request; `tenant` is the authenticated caller's (None without
        authentication: the body's `user`, else "default")."""
        info = self.model(body.model)
        output = self._output_fields(body)
        prompt = body.prompt_text()
        prompt_tokens = self._counter.count(prompt)
        max_output_tokens = self._output_tokens(body, info, prompt_tokens)
        deadlines = self._slo.resolve(body.tags(), headers, now_s)
        return Request(
            id=request_id,
            model=body.model,
            prompt_tokens=prompt_tokens,
            max_output_tokens=max_output_tokens,
            slo_class=deadlines.slo.name,
            arrival_at_s=now_s,
            ttft_deadline_at_s=deadlines.ttft_deadline_at_s,
            completion_deadline_at_s=deadlines.completion_deadline_at_s,
            tenant=tenant or body.user or "default",
            prompt=prompt,
            sampling={**body.sampling(), **output},
            messages=body.engine_messages() if self._engine_kind in CHAT_TEMPLATE_ENGINES else None,
            prefix=prompt_prefix(prompt, prompt_tokens),
        )

    def _output_fields(self, body: Body) -> dict[str, object]:
        """The output fields the client set; 400 naming one the fleet's engines ignore."""
        fields = body.output_fields()
        refused = unsupported(self._engine_kind, fields) or self._history_calls(body)
        if refused is not None:
            raise ApiError(
                400,
                f"'{refused}' is not supported by this fleet's {self._engine_kind!r} engines; "
                "QLM refuses a field it cannot honour rather than ignoring it.",
                param=refused,
                code="unsupported_parameter",
            )
        return fields

    def _history_calls(self, body: Body) -> str | None:
        """An assistant turn's tool calls need the model's own template: without it they
        would silently vanish from the prompt."""
        if self._engine_kind in CHAT_TEMPLATE_ENGINES or not isinstance(body, ChatBody):
            return None
        calls = (i for i, m in enumerate(body.messages) if m.tool_calls)
        return next((f"messages[{i}].tool_calls" for i in calls), None)

    def model(self, name: str) -> ModelConfig:
        info = self._models.get(name)
        if info is None:
            raise ApiError(
                404,
                f"The model {name!r} does not exist; GET /v1/models lists the served models.",
                param="model",
                code="model_not_found",
            )
        return info

    def _output_tokens(self, body: Body, info: ModelConfig, prompt_tokens: int) -> int:
        room = info.max_context_tokens - prompt_tokens
        if room < 1:
            raise ApiError(
                400,
                f"This model's maximum context length is {info.max_context_tokens} tokens; "
                f"the prompt has {prompt_tokens} tokens.",
                param=body.prompt_param,
                code="context_length_exceeded",
            )
        limit = min(room, info.max_output_tokens or room)
        cap = body.output_cap()
        if cap is None:
            return min(self._default_max_tokens, limit)
        if cap > limit:
            raise ApiError(
                400,
                f"{body.cap_param()} is {cap}, but at most {limit} output tokens fit this model "
                f"({info.max_context_tokens} context tokens, {prompt_tokens} in the prompt).",
                param=body.cap_param(),
                code="context_length_exceeded",
            )
        return cap
