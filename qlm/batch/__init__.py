"""Batch jobs: OpenAI's Files and Batch APIs as stored state (qlm/batch/README.md)."""

from qlm.batch.jobs import BatchJob, BatchStatus, LineError, StoredFile
from qlm.batch.store import BatchStore, MemoryBatchStore

__all__ = ["BatchJob", "BatchStatus", "BatchStore", "LineError", "MemoryBatchStore", "StoredFile"]
