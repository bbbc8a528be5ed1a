"""Programs of calls (after Parrot): `/v1/qlm/programs` (submit, list), `/{id}` (state, outputs),
`/{id}/variables/{name}` (one variable, optionally waiting for it), `/{id}/cancel`.

A program is a set of calls whose prompts use `{{name}}` variables: the program's inputs or
other calls' outputs. The server validates the graph (400 naming the call and the variable),
runs each call as soon as its inputs exist and fills them in itself (qlm/api/program_runner.py),
and, given an end-to-end `deadline_s`, gives each call deadlines shared along the critical
path (qlm/programs/deadlines.py). A tenant sees only its own programs (another's answer 404,
like unknown ids). A call's request is an ordinary request (`GET /v1/qlm/requests/{id}`).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from fastapi import FastAPI
from pydantic import Field, field_validator
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from qlm.api.context import ApiContext, json_response
from qlm.api.errors import ApiError
from qlm.api.program_runner import ProgramRunner
from qlm.config import StrictModel
from qlm.control.plan import LoneSpeed
from qlm.programs.deadlines import CallTime, call_deadlines
from qlm.programs.graph import ProgramCall, ProgramError, ProgramGraph, ProgramLimits
from qlm.programs.state import CallState, Program
from qlm.programs.storage import ProgramStore

PROGRAMS = "/v1/qlm/programs"
WAIT_STEP_S = 0.05  # how often a waiting variable read looks again
# What a call's `sampling` may set: fields that shape its text (the program keeps a call's
# text only, so fields that add tool calls or log probabilities are refused, not dropped).
SAMPLING_FIELDS = frozenset({
    "temperature", "top_p", "stop", "seed", "ignore_eos", "presence_penalty",
    "frequency_penalty", "logit_bias", "response_format",
})  # fmt: skip


class SampledBody(StrictModel):
    """The generation fields a call and a context generation share: `max_tokens` and a
    `sampling` refused when it sets other fields than SAMPLING_FIELDS."""

    max_tokens: int | None = Field(default=None, ge=1)
    sampling: dict[str, Any] = Field(
        default_factory=dict, description="Completion fields (temperature, stop, seed, ...)."
    )

    @field_validator("sampling")
    @classmethod
    def _only_sampling(cls, value: dict[str, Any]) -> dict[str, Any]:
        other = sorted(set(value) - SAMPLING_FIELDS)
        if other:
            allowed = ", ".join(sorted(SAMPLING_FIELDS))
            raise ValueError(f"'{other[0]}' is not a sampling field; these are: {allowed}")
        return value


async def tenant_program(ctx: ApiContext, store: ProgramStore, http: HttpRequest) -> Program:
    """The program the path names, if the caller's tenant owns it (another's answers 404
    like an unknown id)."""
    tenant = ctx.authenticate(http) or "default"
    program_id = http.path_params["program_id"]
    program = await store.get(program_id)
    if program is None or program.tenant != tenant:
        raise ApiError(404, f"No program {program_id!r}.", code="program_not_found")
    return program


class CallBody(SampledBody):
    name: str = Field(description="The call's name, also its output variable's.")
    model: str
    prompt: str = Field(description="The prompt; `{{name}}` uses a variable.")


class ProgramBody(StrictModel):
    calls: list[CallBody] = Field(
        default_factory=list,
        description="The calls; none: a session for contexts, running until cancelled.",
    )
    inputs: dict[str, str] = Field(default_factory=dict)
    deadline_s: float | None = Field(default=None, gt=0, description="End to end, from now.")
    slo_class: str | None = None


def add_program_routes(
    app: FastAPI, ctx: ApiContext, store: ProgramStore, runner: ProgramRunner
) -> None:
    routes = _Routes(ctx, store, runner)
    app.add_route(PROGRAMS, routes.submit, methods=["POST"])
    app.add_route(PROGRAMS, routes.list_programs, methods=["GET"])
    app.add_route(PROGRAMS + "/{program_id}", routes.get_program, methods=["GET"])
    app.add_route(PROGRAMS + "/{program_id}/cancel", routes.cancel, methods=["POST"])
    app.add_route(PROGRAMS + "/{program_id}/variables/{name}", routes.variable, methods=["GET"])


class _Routes:
    def __init__(self, ctx: ApiContext, store: ProgramStore, runner: ProgramRunner) -> None:
        self.ctx = ctx
        self.store = store
        self.runner = runner
        self.limits = ProgramLimits(**ctx.settings.api.programs.limits())

    def tenant(self, http: HttpRequest) -> str:
        return self.ctx.authenticate(http) or "default"

    async def submit(self, http: HttpRequest) -> Response:
        tenant = self.tenant(http)
        body = await self.ctx.read(http, ProgramBody.model_validate_json)
        calls = tuple(self._spec(c) for c in body.calls)
        try:
            graph = ProgramGraph.of(calls, tuple(body.inputs), self.limits)
        except ProgramError as exc:
            raise ApiError(400, exc.message, param=exc.param, code="invalid_program") from None
        if body.deadline_s is not None and body.deadline_s > self.ctx.settings.api.max_deadline_s:
            limit = self.ctx.settings.api.max_deadline_s
            raise ApiError(400, f"deadline_s may be at most {limit}.", param="deadline_s")
        now_s = self.ctx.clock.now_s()
        program = Program(f"prog-{uuid.uuid4().hex}", tenant, now_s, body.slo_class,
                          body.deadline_s, calls, dict(body.inputs))  # fmt: skip
        plan = await self.ctx.queue.current_plan()
        times, tokens = self._dry_run(program, graph, {} if plan is None else plan.forecast.lone)
        if body.deadline_s is not None:
            program = replace(program, deadlines=call_deadlines(graph, times, body.deadline_s))
        charge = self.ctx.quotas.charge(tenant, tokens)  # the whole program, at once
        try:
            await self.store.put(program)
        except Exception:
            self.ctx.quotas.refund(charge)
            raise
        self.runner.wake()
        return json_response(program_view(program), 201)

    def _spec(self, call: CallBody) -> ProgramCall:
        max_tokens = call.max_tokens or self.ctx.settings.api.default_max_tokens
        return ProgramCall(call.name, call.model, call.prompt, max_tokens, call.sampling)

    def _dry_run(
        self, program: Program, graph: ProgramGraph, speeds: Mapping[str, LoneSpeed]
    ) -> tuple[dict[str, CallTime], int]:
        """Each call built with its variables empty, so that what the API would refuse in
        it (model, class, fields) is refused now, naming the call; and its time alone, its
        prompt counted with each input's tokens and each used call's output cap. Also the
        tokens of all the calls (prompts and output caps: what the tenant's quota pays)."""
        empty = dict.fromkeys(graph.consumers, "")
        caps = {c.name: c.max_tokens for c in program.calls}
        inputs = {k: self.ctx.admitter.count_tokens(v) for k, v in program.inputs.items()}
        times, total = {}, 0
        for i, call in enumerate(program.calls):
            try:
                request = self.runner.build(program, call, empty)
            except ApiError as exc:
                param = f"calls[{i}]" + (f".{exc.param}" if exc.param else "")
                raise ApiError(exc.status, f"call '{call.name}': {exc.message}", param=param,
                               code=exc.code) from None  # fmt: skip
            used = sum(caps.get(r, inputs.get(r, 0)) for r in call.references)
            speed = speeds.get(call.model)
            prompt_tokens = request.prompt_tokens + used
            total += prompt_tokens + call.max_tokens
            times[call.name] = (
                CallTime(0.5, 1.0)  # no speed known: every call weighs the same
                if speed is None
                else CallTime(
                    speed.first_token_s(prompt_tokens),
                    speed.completion_s(prompt_tokens, call.max_tokens),
                )
            )
        return times, total

    async def _mine(self, http: HttpRequest) -> Program:
        return await tenant_program(self.ctx, self.store, http)

    async def get_program(self, http: HttpRequest) -> Response:
        return json_response(program_view(await self._mine(http)))

    async def list_programs(self, http: HttpRequest) -> Response:
        raw = http.query_params.get("limit", "20")
        if not raw.isdigit() or not 1 <= int(raw) <= 100:
            raise ApiError(400, "limit must be an integer from 1 to 100.", param="limit")
        programs = (await self.store.of_tenant(self.tenant(http)))[: int(raw)]
        return json_response({"object": "list", "data": [program_view(p) for p in programs]})

    async def cancel(self, http: HttpRequest) -> Response:
        program = await self._mine(http)
        if not program.status.is_terminal:
            await self.store.request_cancel(program.id)
            self.runner.wake()
        return json_response(program_view(program), 202)

    async def variable(self, http: HttpRequest) -> Response:
        """One variable: its value once known; `wait_s` waits up to that long for it."""
        program = await self._mine(http)
        name = http.path_params["name"]
        if name not in program.inputs and all(c.name != name for c in program.calls):
            raise ApiError(404, f"Program {program.id} has no variable {name!r}.",
                           code="variable_not_found")  # fmt: skip
        wait_s = _wait_s(http.query_params.get("wait_s", "0"))
        end_s = self.ctx.clock.monotonic_s() + wait_s
        while _pending(program, name) and self.ctx.clock.monotonic_s() < end_s:
            await asyncio.sleep(WAIT_STEP_S)
            program = await self._mine(http)
        return json_response(variable_view(program, name))


def _wait_s(raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 300:
        raise ApiError(400, "wait_s must be a number of seconds from 0 to 300.", param="wait_s")
    return value


def _pending(program: Program, name: str) -> bool:
    if name in program.inputs:
        return False
    return program.state_of(name) in (CallState.WAITING, CallState.QUEUED)


def variable_view(program: Program, name: str) -> dict[str, Any]:
    state = "input" if name in program.inputs else program.state_of(name).value
    return {
        "object": "qlm.program.variable",
        "program_id": program.id,
        "name": name,
        "state": state,
        "value": program.value(name),
        "error": program.errors.get(name),
    }


def program_view(program: Program) -> dict[str, Any]:
    calls = []
    for call in program.calls:
        deadline = program.deadlines.get(call.name)
        at = program.created_at_s
        calls.append({
            "name": call.name,
            "model": call.model,
            "state": program.state_of(call.name).value,
            "request_id": program.request_id(call.name),
            "ttft_deadline_at": None if deadline is None else at + deadline.ttft_s,
            "deadline_at": None if deadline is None else at + deadline.done_s,
            "error": program.errors.get(call.name),
        })  # fmt: skip
    return {
        "id": program.id,
        "object": "qlm.program",
        "status": program.status.value,
        "created_at": program.created_at_s,
        "deadline_at": None
        if program.deadline_s is None
        else program.created_at_s + program.deadline_s,
        "finished_at": program.finished_at_s,
        "slo_class": program.slo_class,
        "calls": calls,
        "outputs": dict(program.outputs),
        "results": list(program.graph().sinks()),
    }
