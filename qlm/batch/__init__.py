"""Batch jobs: OpenAI's Files and Batch APIs as stored state (qlm/batch/README.md)."""

from qlm.batch.job_store import BatchStore, MemoryBatchStore
from qlm.batch.jobs import BatchJob, BatchStatus, LineError, StoredFile

__all__ = ["BatchJob", "BatchStatus", "BatchStore", "LineError", "MemoryBatchStore", "StoredFile"]
