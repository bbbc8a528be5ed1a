"""Runs batch jobs: reads a job's input, queues its good lines as requests, follows them, and
writes the output and error files in OpenAI's format when every line is answered.

Each step is idempotent, so a runner that restarts (or two API replicas running at once) go
on where the stored job says: a line's request id is `<batch id>-<line>`, so queueing it again
finds it there (DuplicateRequestError) instead of running it twice; the output and error files
have ids derived from the job's and are rewritten whole. A line runs as a request sent to the
job's endpoint would, admitted by the same `Admitter` (a body the API would refuse is reported
on its line), in the job's SLO class, with the job's deadline as its TTFT and completion
deadline: the planner plans the lines against it. Lines are not charged to the tenant's rate
quotas (the queue's per-tenant bound still holds them).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from dataclasses import replace

from pydantic import ValidationError

from qlm.api.context import ApiContext
from qlm.api.errors import ApiError, from_pydantic
from qlm.api.formats import CHAT, COMPLETION, Head, OutputFormat, usage
from qlm.api.slo import HEADER_CLASS
from qlm.batch.job_store import BatchStore
from qlm.batch.jobs import BatchJob, BatchStatus, LineError, StoredFile
from qlm.batch.lines import InputLine, NotJsonlError, parse_input
from qlm.prefixes.job_plan import UNBOUNDED, PlanBudget, plan_job, with_plan
from qlm.queue.records import RequestRecord
from qlm.types import Request, RequestState

log = logging.getLogger("qlm.batch")
FORMAT_OF: dict[str, OutputFormat] = {"/v1/chat/completions": CHAT, "/v1/completions": COMPLETION}
EXPIRING = "expiring"  # a time mark: the deadline passed while lines were unanswered


class BatchRunner:
    def __init__(self, ctx: ApiContext, store: BatchStore, poll_s: float = 0.5) -> None:
        self.ctx = ctx
        self.store = store
        self.poll_s = poll_s

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                for job in await self.store.active():
                    await self.advance(job)
            except Exception:  # a failed round must not end the runner
                log.exception("batch runner round failed")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_s)

    async def advance(self, job: BatchJob) -> BatchJob:
        """One step of the job, stored: as far as it can go now."""
        if job.status is BatchStatus.VALIDATING:
            job = await self._start(job)
        if job.status in (BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING):
            job = await self._follow(job)
        if job.status is BatchStatus.FINALIZING:
            job = await self._finalize(job)
        await self.store.put_batch(job)
        return job

    async def _start(self, job: BatchJob) -> BatchJob:
        now_s = self.ctx.clock.now_s()
        content = await self.store.content(job.input_file_id)
        if content is None:
            error = LineError(None, "file_not_found", f"input file {job.input_file_id} is gone")
            return job.moved(BatchStatus.FAILED, now_s, errors=(error,))
        try:
            parsed = parse_input(content, job.endpoint)
        except NotJsonlError as exc:
            error = LineError(None, "invalid_file", f"{exc}", "input_file_id")
            return job.moved(BatchStatus.FAILED, now_s, errors=(error,))
        errors = list(parsed.errors)
        built: list[tuple[InputLine, Request]] = []
        for line in parsed.lines:
            try:
                built.append((line, self._request(job, line, FORMAT_OF[job.endpoint], now_s)))
            except ApiError as exc:
                code = exc.code or "invalid_request"
                errors.append(LineError(line.line, code, exc.message, exc.param, line.custom_id))
        requests = await self._planned(job, [request for _, request in built])
        queued: list[tuple[int, str]] = []
        for (line, _), request in zip(built, requests, strict=True):
            await self._queue_line(job, line, request)
            queued.append((line.line, line.custom_id))
        errors.sort(key=lambda e: e.line or 0)
        changes = {"total": parsed.total, "line_ids": tuple(queued), "errors": tuple(errors)}
        return job.moved(BatchStatus.IN_PROGRESS, now_s, **changes)

    async def _planned(self, job: BatchJob, requests: list[Request]) -> list[Request]:
        """The job's requests planned as a whole (qlm/prefixes/job_plan.py), one plan per
        model, each part within what the smallest instance on the model holds (from the
        published plan; unbounded before there is one). Deterministic, so a repeated step
        plans alike while the fleet stays the same."""
        if not self.ctx.settings.api.batch.prefix_planning:
            return requests
        published = await self.ctx.queue.current_plan()
        budgets = {} if published is None else published.jobs.by_model
        out: dict[str, Request] = {}
        for model in dict.fromkeys(r.model for r in requests):
            mine = [r for r in requests if r.model == model]
            budget = PlanBudget(*budgets.get(model, (UNBOUNDED, UNBOUNDED, UNBOUNDED)))
            job_id = f"{job.id}:{model}"
            plan = plan_job(job_id, mine, budget)
            out.update((r.id, r) for r in with_plan(mine, plan, job_id))
        return [out[r.id] for r in requests]

    async def _queue_line(self, job: BatchJob, line: InputLine, request: Request) -> None:
        """Queue one line's request (already queued: nothing to do)."""
        await self.ctx.enqueue_once(request, f"batch {job.id}: line {line.line}")

    def _request(self, job: BatchJob, line: InputLine, fmt: OutputFormat, now_s: float) -> Request:
        try:
            body = fmt.parse(json.dumps(line.body))
        except ValidationError as exc:
            raise from_pydantic(exc) from None
        headers = {HEADER_CLASS: job.slo_class}
        built = self.ctx.admitter.build(body, headers, job.request_id(line.line), now_s, job.tenant)
        deadline_s = job.deadline_at_s
        return replace(built, ttft_deadline_at_s=deadline_s, completion_deadline_at_s=deadline_s)

    async def _follow(self, job: BatchJob) -> BatchJob:
        now_s = self.ctx.clock.now_s()
        records = await self._records(job)
        if job.status is BatchStatus.IN_PROGRESS and await self.store.cancel_requested(job.id):
            job = job.moved(BatchStatus.CANCELLING, now_s)
        elif now_s >= job.deadline_at_s and EXPIRING not in job.times:
            job = replace(job, times={**job.times, EXPIRING: int(now_s)})
        if job.status is BatchStatus.CANCELLING or EXPIRING in job.times:
            for record in records:
                if not record.state.is_terminal:
                    await self.ctx.cancel(record.request.id)
            records = await self._records(job)
        eta_s = await self._eta_s(records, now_s)
        job = replace(job, counts=_counts(job, records), estimated_done_at_s=eta_s)
        if all(r.state.is_terminal for r in records):
            job = job.moved(BatchStatus.FINALIZING, now_s)
        return job

    async def _eta_s(self, records: list[RequestRecord], now_s: float) -> float | None:
        """When the last unfinished line ends by the latest plan: each queued line when its
        planned group's last member is predicted to end (`group_done_s`), a running one no
        sooner than now; None while a queued line is in no planned group."""
        plan = await self.ctx.queue.current_plan()
        base_s = None if plan is None else plan.forecast.waits_at_s or plan.created_at_s
        eta_s = now_s
        for record in records:
            if record.state.is_terminal:
                continue
            if record.state is not RequestState.QUEUED:
                continue  # in an engine: ends soon, as far as the plan knows
            done_s = None if plan is None else plan.forecast.group_done_s.get(record.group_id or "")
            if base_s is None or done_s is None:
                return None
            eta_s = max(eta_s, base_s + done_s)
        return eta_s

    async def _records(self, job: BatchJob) -> list[RequestRecord]:
        ids = [job.request_id(line) for line, _ in job.line_ids]
        return [r for r in await self.ctx.queue.get_many(ids) if r is not None]

    async def _finalize(self, job: BatchJob) -> BatchJob:
        now_s = self.ctx.clock.now_s()
        records = {r.request.id: r for r in await self._records(job)}
        outputs, errors = [], [_error_line(job, e) for e in job.errors]
        for line, custom_id in job.line_ids:
            record = records.get(job.request_id(line))
            if record is not None and record.state is RequestState.COMPLETED:
                outputs.append(_output_line(job, custom_id, record))
            else:
                errors.append(_failed_line(job, line, custom_id, record))
        output_id = await self._write(job, "output", outputs, now_s)
        error_id = await self._write(job, "errors", errors, now_s)
        status = BatchStatus.COMPLETED
        if BatchStatus.CANCELLING.value in job.times:
            status = BatchStatus.CANCELLED
        elif EXPIRING in job.times:
            status = BatchStatus.EXPIRED
        counts = _counts(job, list(records.values()))
        return job.moved(
            status, now_s, output_file_id=output_id, error_file_id=error_id, counts=counts
        )

    async def _write(
        self, job: BatchJob, kind: str, lines: list[dict[str, object]], now_s: float
    ) -> str | None:
        if not lines:
            return None
        content = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
        data = content.encode()
        file_id = f"file-{job.id}-{kind}"
        name = f"{job.id}_{kind}.jsonl"
        meta = StoredFile(file_id, job.tenant, "batch_output", name, len(data), int(now_s))
        await self.store.put_file(meta, data)
        return file_id


def _counts(job: BatchJob, records: list[RequestRecord]) -> tuple[int, int]:
    completed = sum(r.state is RequestState.COMPLETED for r in records)
    failed = sum(r.state in (RequestState.FAILED, RequestState.CANCELLED) for r in records)
    return completed, failed + len(job.errors)


def _output_line(job: BatchJob, custom_id: str, record: RequestRecord) -> dict[str, object]:
    result = record.result
    assert result is not None
    request = record.request
    head = Head(request.id, int(request.arrival_at_s), request.model)
    prompt_tokens = result.prompt_tokens or request.prompt_tokens
    body = FORMAT_OF[job.endpoint].response(
        head, result.text, result.finish_reason, usage(prompt_tokens, result.output_tokens),
        result.extras,
    )  # fmt: skip
    response = {"status_code": 200, "request_id": request.id, "body": body}
    return {"id": f"batch_req_{request.id}", "custom_id": custom_id, "response": response,
            "error": None}  # fmt: skip


def _failed_line(
    job: BatchJob, line: int, custom_id: str, record: RequestRecord | None
) -> dict[str, object]:
    if record is None:
        error = LineError(line, "request_lost", "the line's request is not in the queue")
    elif record.state is RequestState.CANCELLED:
        why = "the batch expired first" if EXPIRING in job.times else "the batch was cancelled"
        code = "batch_expired" if EXPIRING in job.times else "batch_cancelled"
        error = LineError(line, code, f"not run: {why}")
    else:
        message = record.result.error if record.result and record.result.error else "failed"
        error = LineError(line, "request_failed", message or "failed")
    return _error_line(job, replace(error, custom_id=custom_id))


def _error_line(job: BatchJob, error: LineError) -> dict[str, object]:
    rid = job.request_id(error.line or 0)
    return {"id": f"batch_req_{rid}", "custom_id": error.custom_id, "response": None,
            "error": error.view()}  # fmt: skip
