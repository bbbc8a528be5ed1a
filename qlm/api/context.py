"""What every route needs, built once per app: settings, queue, clock, the admitter, the key
ring, quotas and the wait estimator (with its optional SLO gate), and the enqueue and cancel
calls with their errors mapped to HTTP."""

from __future__ import annotations

import json
import logging
import math
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from qlm.api.admission import Admitter, parse, read_body
from qlm.api.auth import KeyRing
from qlm.api.errors import SERVER_ERROR, ApiError
from qlm.api.quotas import TenantQuotas
from qlm.api.schemas import Body
from qlm.api.slo import HEADER_CLASS
from qlm.api.tokens import TokenCounter, make_token_counter
from qlm.api.wait_estimate import WaitEstimate, WaitEstimator, refuse_unattainable
from qlm.api.wait_forecast import QueueForecaster
from qlm.clock import Clock
from qlm.config.api_settings import ApiAppConfig
from qlm.metrics import NO_METRICS, MetricsHooks
from qlm.queue.queue_protocol import (
    DuplicateRequestError,
    GlobalQueue,
    QueueError,
    QueueFullError,
    QueueUnavailableError,
)
from qlm.queue.records import RequestRecord
from qlm.types import Request

REQUEST_ID_HEADER = "x-qlm-request-id"
RECEIVED_AT = "qlm_received_at_s"  # ASGI state key: when the request reached the app
log = logging.getLogger(__name__)
T = TypeVar("T")


def json_response(
    data: Mapping[str, Any], status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        json.dumps(data, separators=(",", ":")).encode(),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def admitted_headers(request: Request) -> dict[str, str]:
    """The headers of every answer to an admitted request: its id and predicted wait."""
    return {REQUEST_ID_HEADER: request.id, **WaitEstimate.of(request).headers()}


_QUEUE_FULL_CODES = {"queue": "queue_full", "reserved": "queue_full", "tenant": "tenant_queue_full"}


@dataclass(frozen=True)
class ApiContext:
    settings: ApiAppConfig
    queue: GlobalQueue
    clock: Clock
    admitter: Admitter
    created: int  # the models' `created` field: when this app was built
    keys: KeyRing
    quotas: TenantQuotas
    estimator: WaitEstimator  # every admitted request's predicted wait, from the plan
    metrics: MetricsHooks = NO_METRICS  # admissions, refusals and cancels are counted here

    @classmethod
    def build(
        cls,
        settings: ApiAppConfig,
        queue: GlobalQueue,
        clock: Clock,
        token_counter: TokenCounter | None = None,
        metrics: MetricsHooks = NO_METRICS,
        forecaster: QueueForecaster | None = None,
    ) -> ApiContext:
        """The context of an app; `forecaster`: the dispatch decision's wait forecast
        (qlm/api/wait_forecast.py), else waits are estimated from the plan alone."""
        counter = token_counter or make_token_counter(settings.api.token_counter)
        return cls(
            settings,
            queue,
            clock,
            Admitter(settings, counter),
            int(clock.now_s()),
            KeyRing(settings.api_keys),
            TenantQuotas(settings, clock),
            WaitEstimator(queue, settings, clock, forecaster),
            metrics,
        )

    def authenticate(self, http: HttpRequest) -> str | None:
        """The caller's tenant when keys are configured (401 without a known key); None when
        authentication is off."""
        return self.keys.tenant(http.headers) if self.keys.enabled else None

    async def read(self, http: HttpRequest, parser: Callable[[str], T]) -> T:
        """The body, validated by `parser`; a refusal (size, encoding, JSON, fields) is
        counted as a rejected request like the admission's own."""
        try:
            return parse(parser, await read_body(http, self.settings.api.max_body_bytes))
        except ApiError as exc:
            slo_class = http.headers.get(HEADER_CLASS) or self.settings.default_slo_class
            self.metrics.request_rejected("", slo_class, exc.code or exc.type)
            raise

    async def admit(
        self, body: Body, http: HttpRequest, id_prefix: str, tenant: str | None
    ) -> Request:
        """Build the request, estimate its wait from the plan (refusing it when asked to and
        the plan says it misses its TTFT target), check the tenant's quotas, and enqueue it;
        refusals become 429 (with Retry-After) or 503. Each outcome is counted. The request
        carries its estimate (`estimated_wait_s`, `estimate_basis`)."""
        try:
            request = await self._enqueue(body, http, id_prefix, tenant)
        except ApiError as exc:
            requested = body.tags().slo_class or http.headers.get(HEADER_CLASS)
            slo_class = requested or self.settings.default_slo_class
            self.metrics.request_rejected(body.model, slo_class, exc.code or exc.type)
            raise
        self.metrics.request_admitted(request)
        return request

    async def admit_built(self, built: Request) -> Request:
        """Estimate and enqueue a request a route built itself (a program context's fill or
        generation), with `admit`'s refusals (429, 503) and counts."""
        estimate = await self.estimator.estimate(built)
        try:
            request = await self._commit(built, estimate)
        except ApiError as exc:
            self.estimator.forget(built)
            self.metrics.request_rejected(built.model, built.slo_class, exc.code or exc.type)
            raise
        except BaseException:
            self.estimator.forget(built)
            raise
        self.metrics.request_admitted(request)
        return request

    async def _enqueue(
        self, body: Body, http: HttpRequest, id_prefix: str, tenant: str | None
    ) -> Request:
        request_id = id_prefix + uuid.uuid4().hex
        arrival_s = http.scope.get("state", {}).get(RECEIVED_AT)
        if arrival_s is None:  # an app without the stamping middleware
            arrival_s = self.clock.now_s()
        built = self.admitter.build(body, http.headers, request_id, arrival_s, tenant)
        estimate = await self.estimator.estimate(built)
        try:
            return await self._commit(built, estimate)
        except BaseException:
            self.estimator.forget(built)  # not queued after all
            raise

    async def _commit(self, built: Request, estimate: WaitEstimate) -> Request:
        """Enqueue an estimated request (refused when asked to and its estimate misses its
        TTFT target, or over its tenant's quota)."""
        if self.settings.api.reject_unattainable_slo:
            refuse_unattainable(built, estimate)
        request = replace(
            built,
            estimated_wait_s=estimate.wait_s,
            estimated_completion_s=estimate.completion_s,
            estimated_wait_p90_s=estimate.wait_p90_s,
            estimate_basis=estimate.basis,
        )
        charge = self.quotas.charge(
            request.tenant, request.prompt_tokens + request.max_output_tokens
        )
        try:
            await self.queue.enqueue(request)
        except QueueFullError as exc:
            self.quotas.refund(charge)
            raise ApiError(
                429,
                f"Refused: {exc}; retry later.",
                type="rate_limit_error",
                code=_QUEUE_FULL_CODES.get(exc.scope, "queue_full"),
                headers=self._full_retry_headers(estimate),
            ) from None
        except QueueUnavailableError as exc:
            self.quotas.refund(charge)
            raise self.unavailable(exc) from None
        except QueueError as exc:
            self.quotas.refund(charge)
            raise ApiError(
                503, f"The queue refused the request: {exc}", type=SERVER_ERROR, code="queue_error"
            ) from None
        return request

    def _full_retry_headers(self, estimate: WaitEstimate) -> dict[str, str]:
        """A full queue frees places as queued work is served: retry after the predicted wait
        of the request's kind, at least `queue_full_retry_after_s`."""
        retry_s = max(self.settings.api.queue_full_retry_after_s, math.ceil(estimate.wait_s))
        return {"retry-after": str(retry_s), **estimate.headers()}

    def unavailable(self, exc: QueueUnavailableError) -> ApiError:
        """503 with Retry-After: the queue's store is down."""
        return ApiError(
            503,
            f"The queue is not reachable, so the request was not confirmed; retry later ({exc}).",
            type=SERVER_ERROR,
            code="queue_unavailable",
            headers={"retry-after": str(self.settings.api.queue_full_retry_after_s)},
        )

    async def enqueue_once(self, request: Request, what: str) -> None:
        """Queue a request a runner derived (a batch line, a program's call; `what` names it
        in errors): already queued (a repeated step) is fine; a full or unreachable queue is
        a RuntimeError, and the runner's whole step is retried next round."""
        try:
            await self.queue.enqueue(request)
        except DuplicateRequestError:
            return
        except QueueError as exc:
            raise RuntimeError(f"{what} not queued: {exc}") from exc
        self.metrics.request_admitted(request)

    async def cancel(self, request_id: str) -> bool:
        cancelled = await self.queue.cancel(request_id, self.clock.now_s())
        if cancelled and self.metrics is not NO_METRICS:
            record = await self.queue.get(request_id)
            if record is not None:
                self.metrics.request_cancelled(record.request)
        return cancelled

    async def record(self, request_id: str, tenant: str | None) -> RequestRecord:
        """The record, if the caller may see it: with authentication on, another tenant's
        request answers 404 exactly like an unknown id, so ids reveal nothing."""
        record = await self.queue.get(request_id)
        if record is None or (tenant is not None and record.request.tenant != tenant):
            raise ApiError(404, f"No request {request_id!r}.", code="request_not_found")
        return record
