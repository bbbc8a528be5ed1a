"""What every route needs, built once per app: settings, queue, clock, the admitter, and
the enqueue and cancel calls with their errors mapped to HTTP."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from qlm.api.admission import Admitter
from qlm.api.errors import SERVER_ERROR, ApiError
from qlm.api.schemas import Body
from qlm.api.settings import ApiSettings
from qlm.api.tokens import TokenCounter, make_token_counter
from qlm.clock import Clock
from qlm.queue.base import GlobalQueue, QueueError, QueueFullError
from qlm.types import Request

REQUEST_ID_HEADER = "x-qlm-request-id"
log = logging.getLogger(__name__)


def json_response(
    data: Mapping[str, Any], status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        json.dumps(data, separators=(",", ":")).encode(),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


@dataclass(frozen=True)
class ApiContext:
    settings: ApiSettings
    queue: GlobalQueue
    clock: Clock
    admitter: Admitter
    created: int  # the models' `created` field: when this app was built

    @classmethod
    def build(
        cls,
        settings: ApiSettings,
        queue: GlobalQueue,
        clock: Clock,
        token_counter: TokenCounter | None = None,
    ) -> ApiContext:
        counter = token_counter or make_token_counter(settings.token_counter)
        return cls(settings, queue, clock, Admitter(settings, counter), int(clock.now_s()))

    async def admit(self, body: Body, http: HttpRequest, id_prefix: str) -> Request:
        """Build the request and enqueue it; the queue's refusals become 429 or 503."""
        request_id = id_prefix + uuid.uuid4().hex
        request = self.admitter.build(body, http.headers, request_id, self.clock.now_s())
        try:
            await self.queue.enqueue(request)
        except QueueFullError:
            raise ApiError(
                429,
                "The queue is full; retry later.",
                type="rate_limit_error",
                code="queue_full",
                headers={"retry-after": "1"},
            ) from None
        except QueueError as exc:
            raise ApiError(
                503, f"The queue refused the request: {exc}", type=SERVER_ERROR, code="queue_error"
            ) from None
        return request

    async def cancel(self, request_id: str) -> bool:
        return await self.queue.cancel(request_id, self.clock.now_s())
