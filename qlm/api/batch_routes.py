"""OpenAI's Files and Batch APIs: `/v1/files` (upload, list, retrieve, content, delete) and
`/v1/batches` (create, retrieve, list, cancel), as the official client calls them. Jobs run
in the batch runner (qlm/api/batch_runner.py); state lives in a `BatchStore`
(qlm/batch/job_store.py). A tenant sees only its own files and jobs: another's answer 404, like
unknown ids. QLM's extensions: metadata `qlm_slo_class` (the lines' SLO class) and
`qlm_deadline_s` (seconds from creation, tighter than the window), and a `qlm` field on each
job (its class and deadline).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

from fastapi import FastAPI
from pydantic import Field
from starlette.datastructures import UploadFile
from starlette.requests import Request as HttpRequest
from starlette.responses import Response

from qlm.api.context import ApiContext, json_response
from qlm.api.errors import ApiError
from qlm.batch.job_store import BatchStore
from qlm.batch.jobs import BatchJob, StoredFile
from qlm.batch.lines import ENDPOINTS
from qlm.config import StrictModel

PURPOSES = ("batch",)
_WINDOW = re.compile(r"^(\d+)([hm])$")


class BatchCreate(StrictModel):
    input_file_id: str = Field(min_length=1)
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = Field(default=None, max_length=16)


def add_batch_routes(app: FastAPI, ctx: ApiContext, store: BatchStore) -> None:
    routes = _Routes(ctx, store)
    app.add_route("/v1/files", routes.upload, methods=["POST"])
    app.add_route("/v1/files", routes.list_files, methods=["GET"])
    app.add_route("/v1/files/{file_id}", routes.get_file, methods=["GET"])
    app.add_route("/v1/files/{file_id}", routes.delete_file, methods=["DELETE"])
    app.add_route("/v1/files/{file_id}/content", routes.file_content, methods=["GET"])
    app.add_route("/v1/batches", routes.create, methods=["POST"])
    app.add_route("/v1/batches", routes.list_batches, methods=["GET"])
    app.add_route("/v1/batches/{batch_id}", routes.get_batch, methods=["GET"])
    app.add_route("/v1/batches/{batch_id}/cancel", routes.cancel, methods=["POST"])


class _Routes:
    def __init__(self, ctx: ApiContext, store: BatchStore) -> None:
        self.ctx = ctx
        self.store = store
        self.settings = ctx.settings.api.batch

    def tenant(self, http: HttpRequest) -> str:
        return self.ctx.authenticate(http) or "default"

    async def upload(self, http: HttpRequest) -> Response:
        tenant = self.tenant(http)
        limit = self.settings.max_file_bytes
        declared = http.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit + 64 * 1024:
            raise ApiError(413, f"Files may hold at most {limit} bytes.", code="file_too_large")
        form = await http.form(max_files=1, max_fields=8)
        upload, purpose = form.get("file"), form.get("purpose")
        if not isinstance(upload, UploadFile):
            raise ApiError(400, "A multipart field 'file' must hold the file.", param="file")
        if purpose not in PURPOSES:
            raise ApiError(400, f"purpose must be one of {list(PURPOSES)}; QLM runs batch files "
                           "only.", param="purpose")  # fmt: skip
        content = await upload.read(limit + 1)
        if len(content) > limit:
            raise ApiError(413, f"Files may hold at most {limit} bytes.", code="file_too_large")
        now = int(self.ctx.clock.now_s())
        name = upload.filename or "upload.jsonl"
        meta = StoredFile(f"file-{uuid.uuid4().hex}", tenant, str(purpose), name, len(content), now)
        await self.store.put_file(meta, content)
        return json_response(meta.view())

    async def list_files(self, http: HttpRequest) -> Response:
        purpose = http.query_params.get("purpose")
        files = await self.store.files(self.tenant(http), purpose)
        return json_response(_page([f.view() for f in files], http))

    async def _file(self, http: HttpRequest) -> StoredFile:
        file_id = http.path_params["file_id"]
        meta = await self.store.file(file_id)
        if meta is None or meta.tenant != self.tenant(http):
            raise ApiError(404, f"No file {file_id!r}.", param="file_id", code="file_not_found")
        return meta

    async def get_file(self, http: HttpRequest) -> Response:
        return json_response((await self._file(http)).view())

    async def file_content(self, http: HttpRequest) -> Response:
        meta = await self._file(http)
        content = await self.store.content(meta.id) or b""
        return Response(content, media_type="application/octet-stream")

    async def delete_file(self, http: HttpRequest) -> Response:
        meta = await self._file(http)
        deleted = await self.store.delete_file(meta.id)
        return json_response({"id": meta.id, "object": "file", "deleted": deleted})

    async def create(self, http: HttpRequest) -> Response:
        tenant = self.tenant(http)
        body = await self.ctx.read(http, BatchCreate.model_validate_json)
        if body.endpoint not in ENDPOINTS:
            raise ApiError(400, f"endpoint must be one of {list(ENDPOINTS)}.", param="endpoint")
        source = await self.store.file(body.input_file_id)
        if source is None or source.tenant != tenant:
            raise ApiError(404, f"No file {body.input_file_id!r}.", param="input_file_id",
                           code="file_not_found")  # fmt: skip
        now_s = self.ctx.clock.now_s()
        metadata = dict(body.metadata or {})
        window_s = self._window_s(body.completion_window)
        deadline_s = min(window_s, self._deadline_s(metadata))
        job = BatchJob(
            id=f"batch_{uuid.uuid4().hex}",
            tenant=tenant,
            endpoint=body.endpoint,
            input_file_id=body.input_file_id,
            completion_window=body.completion_window,
            created_at=int(now_s),
            deadline_at_s=now_s + deadline_s,
            slo_class=self._slo_class(metadata),
            metadata=metadata,
        )
        await self.store.put_batch(job)
        return json_response(job.view())

    def _window_s(self, window: str) -> float:
        match = _WINDOW.match(window)
        seconds = 0.0 if match is None else int(match[1]) * (3600 if match[2] == "h" else 60)
        if not 0 < seconds <= self.ctx.settings.api.max_deadline_s:
            raise ApiError(400, "completion_window must be hours or minutes like '24h' or "
                           f"'90m', at most {self.ctx.settings.api.max_deadline_s:g} s.",
                           param="completion_window")  # fmt: skip
        return seconds

    def _deadline_s(self, metadata: dict[str, str]) -> float:
        raw = metadata.get("qlm_deadline_s")
        if raw is None:
            return float("inf")
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not 0 < value < float("inf"):
            raise ApiError(400, "metadata.qlm_deadline_s must be a positive number of seconds.",
                           param="metadata.qlm_deadline_s")  # fmt: skip
        return value

    def _slo_class(self, metadata: dict[str, str]) -> str:
        classes = self.ctx.settings.slo_classes
        name = metadata.get("qlm_slo_class") or self.settings.slo_class
        if name is None:
            return min(classes, key=lambda c: c.priority).name
        if name not in {c.name for c in classes}:
            raise ApiError(400, f"Unknown SLO class {name!r}; known: "
                           f"{sorted(c.name for c in classes)}.",
                           param="metadata.qlm_slo_class")  # fmt: skip
        return name

    async def _batch(self, http: HttpRequest) -> BatchJob:
        batch_id = http.path_params["batch_id"]
        job = await self.store.batch(batch_id)
        if job is None or job.tenant != self.tenant(http):
            raise ApiError(404, f"No batch {batch_id!r}.", param="batch_id",
                           code="batch_not_found")  # fmt: skip
        return job

    async def get_batch(self, http: HttpRequest) -> Response:
        return json_response(await self._view(await self._batch(http)))

    async def list_batches(self, http: HttpRequest) -> Response:
        jobs = await self.store.batches(self.tenant(http))
        return json_response(_page([await self._view(j) for j in jobs], http))

    async def cancel(self, http: HttpRequest) -> Response:
        job = await self._batch(http)
        if job.status.is_terminal:
            raise ApiError(409, f"Batch {job.id} is already {job.status.value}.",
                           code="batch_terminal")  # fmt: skip
        await self.store.request_cancel(job.id)
        return json_response(await self._view(job))

    async def _view(self, job: BatchJob) -> dict[str, Any]:
        """The job's view; one whose cancel was asked shows `cancelling` until the runner
        has moved it."""
        view = job.view()
        if not job.status.is_terminal and await self.store.cancel_requested(job.id):
            view["status"] = "cancelling"
        return view


def _page(data: list[dict[str, Any]], http: HttpRequest) -> dict[str, Any]:
    """OpenAI's list shape, `after` (an id) and `limit` (default 20, at most 100) applied."""
    after = http.query_params.get("after")
    if after is not None:
        ids = [item["id"] for item in data]
        data = data[ids.index(after) + 1 :] if after in ids else []
    raw = http.query_params.get("limit", "20")
    if not raw.isdigit():
        raise ApiError(400, "limit must be a positive integer.", param="limit")
    limit = max(1, min(100, int(raw)))
    page = data[:limit]
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": len(data) > limit,
    }
