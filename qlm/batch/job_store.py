"""Where batch jobs and files live: the `BatchStore` protocol, and the embedded store.

The API writes a job when it is created and files when they are uploaded; the batch runner
(qlm/api/batch_runner.py) is the only writer of a job afterwards. A cancel is a flag of its own
(`request_cancel`), which the runner reads, so that it never races the runner's writes. The
Redis store (qlm/queue/redis/batch_store.py) keeps the same in the queue's Redis, so that jobs and
files survive a restart of every process.
"""

from __future__ import annotations

from typing import Protocol

from qlm.batch.jobs import BatchJob, StoredFile


class BatchStore(Protocol):
    async def put_file(self, meta: StoredFile, content: bytes) -> None: ...
    async def file(self, file_id: str) -> StoredFile | None: ...
    async def content(self, file_id: str) -> bytes | None: ...
    async def files(self, tenant: str, purpose: str | None = None) -> list[StoredFile]:
        """The tenant's files, newest first."""
        ...

    async def delete_file(self, file_id: str) -> bool: ...
    async def put_batch(self, job: BatchJob) -> None: ...
    async def batch(self, batch_id: str) -> BatchJob | None: ...
    async def batches(self, tenant: str) -> list[BatchJob]:
        """The tenant's jobs, newest first."""
        ...

    async def active(self) -> list[BatchJob]:
        """Every job not yet in a terminal status, oldest first (the runner's work)."""
        ...

    async def request_cancel(self, batch_id: str) -> None: ...
    async def cancel_requested(self, batch_id: str) -> bool: ...
    async def close(self) -> None: ...


class MemoryBatchStore:
    """The embedded store: in this process, gone with it (like the memory queue)."""

    def __init__(self) -> None:
        self._files: dict[str, tuple[StoredFile, bytes]] = {}
        self._jobs: dict[str, BatchJob] = {}
        self._cancels: set[str] = set()

    async def put_file(self, meta: StoredFile, content: bytes) -> None:
        self._files[meta.id] = (meta, content)

    async def file(self, file_id: str) -> StoredFile | None:
        found = self._files.get(file_id)
        return None if found is None else found[0]

    async def content(self, file_id: str) -> bytes | None:
        found = self._files.get(file_id)
        return None if found is None else found[1]

    async def files(self, tenant: str, purpose: str | None = None) -> list[StoredFile]:
        mine = [m for m, _ in self._files.values() if m.tenant == tenant]
        mine = [m for m in mine if purpose is None or m.purpose == purpose]
        return sorted(mine, key=lambda m: (m.created_at, m.id), reverse=True)

    async def delete_file(self, file_id: str) -> bool:
        return self._files.pop(file_id, None) is not None

    async def put_batch(self, job: BatchJob) -> None:
        self._jobs[job.id] = job

    async def batch(self, batch_id: str) -> BatchJob | None:
        return self._jobs.get(batch_id)

    async def batches(self, tenant: str) -> list[BatchJob]:
        mine = [j for j in self._jobs.values() if j.tenant == tenant]
        return sorted(mine, key=lambda j: (j.created_at, j.id), reverse=True)

    async def active(self) -> list[BatchJob]:
        jobs = [j for j in self._jobs.values() if not j.status.is_terminal]
        return sorted(jobs, key=lambda j: (j.created_at, j.id))

    async def request_cancel(self, batch_id: str) -> None:
        self._cancels.add(batch_id)

    async def cancel_requested(self, batch_id: str) -> bool:
        return batch_id in self._cancels

    async def close(self) -> None:
        return None
