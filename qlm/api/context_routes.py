"""A program's contexts over HTTP (Parrot's Fill / Fork / Generate / FreeContext):
`/v1/qlm/programs/{id}/contexts` (fill a new one, list), `/{name}` (read, free), `/{name}/fork`,
`/{name}/generate`. What a context is and how its generations find the engine that holds its
text: qlm/programs/program_contexts.py.

A context belongs to a running program of the caller's tenant (a program of no calls is a
session for contexts, running until cancelled); it ends with the program. Fills and
generations are ordinary requests of the program's class (`GET /v1/qlm/requests/{id}` reads
them), charged to the tenant's quota like any request: the prompt's tokens and the output
cap.
"""

from __future__ import annotations

import uuid
from dataclasses import replace
from typing import Any

from fastapi import FastAPI
from pydantic import Field
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from qlm.api.context import ApiContext, json_response
from qlm.api.errors import ApiError
from qlm.api.program_routes import PROGRAMS, SampledBody, tenant_program
from qlm.api.program_runner import ProgramRunner
from qlm.config import StrictModel
from qlm.programs.graph import NAME
from qlm.programs.program_contexts import ProgramContext
from qlm.programs.state import Program
from qlm.programs.storage import ProgramStore

CONTEXTS = PROGRAMS + "/{program_id}/contexts"


class FillBody(StrictModel):
    name: str = Field(description="The context's name within its program.")
    text: str = Field(description="Its text, after its parent's (if any).")
    parent: str | None = Field(default=None, description="A context it continues.")
    model: str | None = Field(default=None, description="Required without a parent.")


class ForkBody(StrictModel):
    name: str = Field(description="The child's name; it starts with its parent's text.")


class GenerateBody(SampledBody):
    prompt: str = Field(description="Text after the context's.")


def add_context_routes(
    app: FastAPI, ctx: ApiContext, store: ProgramStore, runner: ProgramRunner
) -> None:
    routes = _Routes(ctx, store, runner)
    app.add_route(CONTEXTS, routes.fill, methods=["POST"])
    app.add_route(CONTEXTS, routes.list_contexts, methods=["GET"])
    app.add_route(CONTEXTS + "/{name}", routes.get_context, methods=["GET"])
    app.add_route(CONTEXTS + "/{name}", routes.free, methods=["DELETE"])
    app.add_route(CONTEXTS + "/{name}/fork", routes.fork, methods=["POST"])
    app.add_route(CONTEXTS + "/{name}/generate", routes.generate, methods=["POST"])


class _Routes:
    def __init__(self, ctx: ApiContext, store: ProgramStore, runner: ProgramRunner) -> None:
        self.ctx = ctx
        self.store = store
        self.runner = runner

    async def fill(self, http: HttpRequest) -> Response:
        program, contexts = await self._running(http)
        body = await self.ctx.read(http, FillBody.model_validate_json)
        self._new_name(body.name, contexts)
        parent = None if body.parent is None else _known(contexts, body.parent, "parent")
        model = body.model or (parent.model if parent else None)
        if model is None:
            raise ApiError(400, "model is required for a context without a parent.", param="model")
        if parent is not None and model != parent.model:
            raise ApiError(400, f"model must be the parent's ({parent.model}).", param="model")
        text = (parent.text if parent else "") + body.text
        now_s = self.ctx.clock.now_s()
        context = ProgramContext(body.name, model, text, body.parent, now_s, None)
        fill_id = context.request_id(program.id, "fill")
        context = replace(context, fill_request_id=fill_id)
        fields = {"model": model, "prompt": text, "max_tokens": 1}
        await self.ctx.admit_built(self.runner.completion(program, fill_id, fields, len(text)))
        await self.store.put_context(program.id, context)
        return json_response(context_view(program, context), 201)

    async def fork(self, http: HttpRequest) -> Response:
        program, contexts = await self._running(http)
        parent = _known(contexts, http.path_params["name"], "name")
        body = await self.ctx.read(http, ForkBody.model_validate_json)
        self._new_name(body.name, contexts)
        now_s = self.ctx.clock.now_s()
        child = ProgramContext(body.name, parent.model, parent.text, parent.name, now_s, None)
        await self.store.put_context(program.id, child)
        return json_response(context_view(program, child), 201)

    async def generate(self, http: HttpRequest) -> Response:
        program, contexts = await self._running(http)
        context = _known(contexts, http.path_params["name"], "name")
        body = await self.ctx.read(http, GenerateBody.model_validate_json)
        max_tokens = body.max_tokens or self.ctx.settings.api.default_max_tokens
        fields = {"model": context.model, "prompt": context.text + body.prompt,
                  "max_tokens": max_tokens, **body.sampling}  # fmt: skip
        request_id = context.request_id(program.id, uuid.uuid4().hex)
        built = self.runner.completion(program, request_id, fields, len(context.text))
        await self.ctx.admit_built(built)
        return json_response({"request_id": request_id, "context": context.name}, 202)

    async def list_contexts(self, http: HttpRequest) -> Response:
        program = await self._mine(http)
        contexts = await self.store.contexts(program.id)
        data = [context_view(program, c) for c in sorted(contexts.values(), key=_created)]
        return json_response({"object": "list", "data": data})

    async def get_context(self, http: HttpRequest) -> Response:
        program = await self._mine(http)
        contexts = await self.store.contexts(program.id)
        return json_response(
            context_view(program, _known(contexts, http.path_params["name"], "name"))
        )

    async def free(self, http: HttpRequest) -> Response:
        program = await self._mine(http)
        name = http.path_params["name"]
        if not await self.store.drop_contexts(program.id, [name]):
            raise ApiError(404, f"Program {program.id} has no context {name!r}.", param="name",
                           code="context_not_found")  # fmt: skip
        return Response(status_code=204)

    # ---------------------------------------------------------------- inside

    async def _mine(self, http: HttpRequest) -> Program:
        return await tenant_program(self.ctx, self.store, http)

    async def _running(self, http: HttpRequest) -> tuple[Program, dict[str, ProgramContext]]:
        program = await self._mine(http)
        if program.status.is_terminal:
            raise ApiError(409, f"Program {program.id} has ended ({program.status.value}); "
                           "its contexts went with it.", code="program_ended")  # fmt: skip
        return program, await self.store.contexts(program.id)

    def _new_name(self, name: str, contexts: dict[str, ProgramContext]) -> None:
        if not NAME.fullmatch(name):
            raise ApiError(400, f"context name {name!r} is not a valid name.", param="name")
        if name in contexts:
            raise ApiError(409, f"A context {name!r} exists.", param="name", code="context_exists")


def _known(contexts: dict[str, ProgramContext], name: str, param: str) -> ProgramContext:
    context = contexts.get(name)
    if context is None:
        raise ApiError(404, f"No context {name!r}.", param=param, code="context_not_found")
    return context


def _created(context: ProgramContext) -> tuple[float, str]:
    return context.created_at_s, context.name


def context_view(program: Program, context: ProgramContext) -> dict[str, Any]:
    return {
        "object": "qlm.context",
        "program_id": program.id,
        "name": context.name,
        "model": context.model,
        "parent": context.parent,
        "text_chars": len(context.text),
        "fill_request_id": context.fill_request_id,
        "created_at_s": context.created_at_s,
    }
