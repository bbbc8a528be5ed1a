"""Runs programs (qlm/programs): queues each call once its inputs exist, its prompt filled in
server-side, and copies each ended call's output into the program, until every call has ended.

Each step is idempotent, so a runner that restarts (or two API replicas running at once) go
on where the stored program says: a call's request id is `<program id>.<call>`, so queueing it
again finds it there (DuplicateRequestError) instead of running it twice. A call runs as a
completion sent with the call's fields would, admitted by the same `Admitter`, in the
program's SLO class; with an end-to-end deadline, at the deadlines the program derived for it
(qlm/programs/deadlines.py), so the planner plans each call against the whole program's
promise. The runner wakes as soon as a call it queued ends (it follows the call's output
stream), so a chain of calls pays no client round trip between its steps; a poll every
`poll_s` catches what a restart left.
"""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from qlm.aio import first_done
from qlm.api.context import ApiContext
from qlm.api.errors import ApiError, from_pydantic
from qlm.api.formats import COMPLETION
from qlm.api.slo import HEADER_CLASS
from qlm.prefixes.prompt_blocks import prompt_prefix
from qlm.programs.fork import leaders
from qlm.programs.graph import ProgramCall, ProgramGraph, render
from qlm.programs.state import CallState, Program, ProgramStatus
from qlm.programs.storage import ProgramStore
from qlm.queue.records import RequestRecord
from qlm.types import Request, RequestState

log = logging.getLogger("qlm.programs")
ENDED = (CallState.COMPLETED, CallState.FAILED)


class ProgramRunner:
    def __init__(self, ctx: ApiContext, store: ProgramStore, poll_s: float = 0.5) -> None:
        self.ctx = ctx
        self.store = store
        self.poll_s = poll_s
        self._wake = asyncio.Event()
        self._watched: dict[str, asyncio.Task[None]] = {}

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                self._wake.clear()
                try:
                    for program in await self.store.active():
                        await self._step(program)
                except Exception:  # a failed round must not end the runner
                    log.exception("program runner round failed")
                await first_done((stop.wait(), self._wake.wait()), self.poll_s)
        finally:
            for task in self._watched.values():
                task.cancel()
            await asyncio.gather(*self._watched.values(), return_exceptions=True)

    async def _step(self, program: Program) -> None:
        try:
            await self.advance(program)
        except Exception:  # one program's failure must not hold back the others
            log.exception("program %s: step failed; retried next round", program.id)

    def wake(self) -> None:
        """Run a round now (a program was submitted or cancelled)."""
        self._wake.set()

    def build(self, program: Program, call: ProgramCall, values: dict[str, str]) -> Request:
        """The request a call runs as, its prompt filled with `values` (an ApiError names
        what the API would refuse in it)."""
        body = {"model": call.model, "prompt": render(call.prompt, values),
                "max_tokens": call.max_tokens, **call.sampling}  # fmt: skip
        # the template's text up to its first variable is a block of its own: every run of
        # the template shares it (Parrot's prefix at the variable boundary)
        request = self.completion(program, program.request_id(call.name), body, len(call.head))
        deadline = program.deadlines.get(call.name)
        if deadline is None:
            return request
        # A call queued after its first token was due is as urgent as a request can be.
        start_s, arrival_s = program.created_at_s, request.arrival_at_s
        ttft_s = max(arrival_s, start_s + deadline.ttft_s)
        done_s = max(ttft_s, start_s + deadline.done_s)
        return replace(request, ttft_deadline_at_s=ttft_s, completion_deadline_at_s=done_s)

    def completion(
        self, program: Program, request_id: str, body: dict[str, Any], cut: int
    ) -> Request:
        """A completion of the program's tenant and class from a request body (an ApiError
        names what the API would refuse in it); the prompt's first `cut` characters end a
        prefix block, so that other prompts starting with them share it."""
        try:
            parsed = COMPLETION.parse(json.dumps(body))
        except ValidationError as exc:
            raise from_pydantic(exc) from None
        headers = {HEADER_CLASS: program.slo_class} if program.slo_class else {}
        now_s = self.ctx.clock.now_s()
        request = self.ctx.admitter.build(parsed, headers, request_id, now_s, program.tenant)
        blocks = prompt_prefix(request.prompt, request.prompt_tokens, cuts=(cut,))
        return replace(request, prefix=blocks)

    async def advance(self, program: Program) -> Program:
        """One step of the program, stored: as far as it can go now."""
        now_s, before = self.ctx.clock.now_s(), program
        cancelling = await self.store.cancel_requested(program.id)
        records = await self._records(program)
        program = _collect(program, records)
        if cancelling:
            program = await self._cancel(program, records)
        else:
            program = await self._queue_ready(program)
        # a program of no calls (a session for its contexts) runs until it is cancelled
        ended = all(program.state_of(c.name) in ENDED for c in program.calls)
        if cancelling or (ended and program.calls):
            status = ProgramStatus.FAILED if program.errors else ProgramStatus.COMPLETED
            status = ProgramStatus.CANCELLED if cancelling else status
            program = replace(program, status=status, finished_at_s=now_s)
            await self.store.drop_contexts(program.id)  # they end with it
        if program != before:  # most rounds change nothing: no write
            await self.store.put(program)
        return program

    async def _records(self, program: Program) -> dict[str, RequestRecord | None]:
        """The records of its queued calls that have not ended in the program yet (None:
        the queue no longer has it, its record expired while no runner looked)."""
        ended = set(program.outputs) | set(program.errors)
        open_calls = [c for c in program.queued if c not in ended]
        ids = [program.request_id(c) for c in open_calls]
        found = await asyncio.gather(*(self.ctx.queue.get(rid) for rid in ids))
        return dict(zip(open_calls, found, strict=True))

    async def _queue_ready(self, program: Program) -> Program:
        graph = program.graph()
        errors = {**program.errors, **_downstream_failures(program, graph)}
        values = {**program.inputs, **program.outputs}
        queued = list(program.queued)
        ready = [c for c in graph.ready(set(program.outputs)) if c.name not in errors]
        built = {}
        for call in ready:
            if call.name not in queued:
                try:
                    built[call.name] = self.build(program, call, values)
                except ApiError as exc:  # e.g. the filled prompt is over the context
                    errors[call.name] = f"not run: {exc.message}"
        # calls ready together that start with the same text wait for the first to compute
        # it (qlm/programs/fork.py)
        waits = leaders({name: request.prefix for name, request in built.items()})
        for name, request in built.items():
            leader = waits.get(name)
            if leader is not None:
                request = replace(request, job_leader=program.request_id(leader))
            await self.ctx.enqueue_once(request, f"call {request.id}")
            queued.append(name)
        for call in ready:
            if call.name not in errors:  # its request exists: wake when it ends
                self._watch(program.request_id(call.name))
        return replace(program, queued=tuple(queued), errors=errors)

    async def _cancel(self, program: Program, records: dict[str, RequestRecord | None]) -> Program:
        for name, record in records.items():
            if record is not None and not record.state.is_terminal:
                await self.ctx.cancel(program.request_id(name))
        program = _collect(program, await self._records(program))
        errors = dict(program.errors)
        for call in program.calls:
            if call.name not in program.outputs and call.name not in errors:
                errors[call.name] = "not run: the program was cancelled"
        return replace(program, errors=errors)

    def _watch(self, request_id: str) -> None:
        """Wake the runner when the request ends (its output stream's last event)."""
        if request_id in self._watched:
            return
        task = asyncio.get_running_loop().create_task(self._follow(request_id))
        self._watched[request_id] = task

    async def _follow(self, request_id: str) -> None:
        try:
            async for _ in self.ctx.queue.stream(request_id, timeout_s=self.poll_s * 120):
                pass
        except Exception:  # gone, timed out or the queue is down: the poll takes over
            pass
        finally:
            self._watched.pop(request_id, None)
            self._wake.set()


def _collect(program: Program, records: dict[str, RequestRecord | None]) -> Program:
    """The program with the output (or failure) of each call whose request ended."""
    outputs, errors = dict(program.outputs), dict(program.errors)
    for call, record in records.items():
        if record is None:
            errors[call] = "lost: its request's record expired before its output was kept"
        elif record.state is RequestState.COMPLETED and record.result is not None:
            outputs[call] = record.result.text
        elif record.state.is_terminal:
            why = record.result.error if record.result and record.result.error else None
            errors[call] = f"{record.state.value}: {why}" if why else record.state.value
    return replace(program, outputs=outputs, errors=errors)


def _downstream_failures(program: Program, graph: ProgramGraph) -> dict[str, str]:
    """Calls not yet queued that use, directly or not, the output of a failed call."""
    failed: dict[str, str] = {}
    for call in graph.calls:  # each after the calls it uses
        if call.name in program.errors or call.name in program.queued:
            continue
        bad = next((r for r in call.references if r in program.errors or r in failed), None)
        if bad is not None:
            failed[call.name] = f"not run: its input '{bad}' failed"
    return failed
