"""JSON views of what the API reports: the model list, a request record, the queue counts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from qlm.api.formats import usage
from qlm.config.api_settings import ModelConfig
from qlm.output_extras import final_tool_calls
from qlm.queue.records import RequestRecord, RequestResult
from qlm.types import Request, RequestState

Json = dict[str, Any]


def model_card(name: str, info: ModelConfig, created: int) -> Json:
    return {
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "qlm",
        "max_model_len": info.max_context_tokens,
    }


def model_list(models: Mapping[str, ModelConfig], created: int) -> Json:
    return {
        "object": "list",
        "data": [model_card(name, models[name], created) for name in sorted(models)],
    }


def accepted(request: Request, kind: str) -> Json:
    """The 202 answer to an asynchronous submission."""
    return {
        "id": request.id,
        "object": "qlm.request",
        "kind": kind,
        "state": str(request.state),
        "model": request.model,
        "slo_class": request.slo_class,
        "prompt_tokens": request.prompt_tokens,
        "max_output_tokens": request.max_output_tokens,
        **_estimate(request),
        "times": _request_times(request),
    }


def record_view(record: RequestRecord) -> Json:
    request, result = record.request, record.result
    return {
        "id": request.id,
        "object": "qlm.request",
        "state": str(request.state),
        "model": request.model,
        "slo_class": request.slo_class,
        "tenant": request.tenant,
        "prompt_tokens": request.prompt_tokens,
        "max_output_tokens": request.max_output_tokens,
        **_estimate(request),
        "predicted_wait_s": record.predicted_wait_s,
        "group_id": record.group_id,
        "instance_id": record.instance_id or (result.instance_id if result else None),
        "dispatches": record.dispatches,
        "evictions": record.evictions,
        "times": {
            **_request_times(request),
            "lease_expires_at_s": record.lease_expires_at_s,
            "dispatched_at_s": result.dispatched_at_s if result else None,
            # While it runs: its first attempt's first token (kept through evictions).
            "first_token_at_s": result.first_token_at_s if result else record.first_token_at_s,
            "finished_at_s": result.finished_at_s if result else None,
        },
        "result": None if result is None else _result_view(request, result),
    }


def _estimate(request: Request) -> Json:
    """The wait the API predicted at admission (from arrival to first token) and its basis;
    `predicted_wait_s` is the latest plan's, measured from that plan's re-plan time."""
    return {
        "estimated_wait_s": request.estimated_wait_s,
        "estimated_completion_s": request.estimated_completion_s,
        "estimated_wait_p90_s": request.estimated_wait_p90_s,
        "estimate_basis": request.estimate_basis or None,
    }


def _request_times(request: Request) -> Json:
    return {
        "arrival_at_s": request.arrival_at_s,
        "ttft_deadline_at_s": request.ttft_deadline_at_s,
        "completion_deadline_at_s": request.completion_deadline_at_s,
    }


def _result_view(request: Request, result: RequestResult) -> Json:
    return {
        "state": str(result.state),
        "text": result.text,
        "finish_reason": result.finish_reason,
        "usage": usage(result.prompt_tokens or request.prompt_tokens, result.output_tokens),
        "error": result.error,
        "tool_calls": final_tool_calls(result.extras),
        "logprobs": (result.extras or {}).get("logprobs"),
    }


def queue_counts(counts: Mapping[RequestState, int]) -> Json:
    by_state = {str(state): int(counts.get(state, 0)) for state in RequestState}
    return {"object": "qlm.queue", "counts": by_state, "total": sum(by_state.values())}
