"""Where programs live: the `ProgramStore` protocol, and the embedded store.

The API writes a program when it is submitted; the program runner (qlm/api/program_runner.py)
is its only writer afterwards. A cancel is a flag of its own (`request_cancel`), which the
runner reads, so that it never races the runner's writes. The Redis store
(qlm/queue/redis/program_store.py) keeps the same in the queue's Redis, so that programs
survive a restart of every process.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from qlm.programs.state import Program


class ProgramStore(Protocol):
    async def put(self, program: Program) -> None: ...
    async def get(self, program_id: str) -> Program | None: ...
    async def of_tenant(self, tenant: str) -> list[Program]:
        """The tenant's programs, newest first."""
        ...

    async def active(self) -> list[Program]:
        """Every program still running, oldest first (the runner's work)."""
        ...

    async def request_cancel(self, program_id: str) -> None: ...
    async def cancel_requested(self, program_id: str) -> bool: ...
    async def close(self) -> None: ...


class MemoryProgramStore:
    """The embedded store: in this process, gone with it (like the memory queue)."""

    def __init__(self) -> None:
        self._programs: dict[str, Program] = {}
        self._cancels: set[str] = set()

    async def put(self, program: Program) -> None:
        self._programs[program.id] = program
        if program.status.is_terminal:
            self._cancels.discard(program.id)

    async def get(self, program_id: str) -> Program | None:
        return self._programs.get(program_id)

    async def of_tenant(self, tenant: str) -> list[Program]:
        return newest_first(p for p in self._programs.values() if p.tenant == tenant)

    async def active(self) -> list[Program]:
        running = [p for p in self._programs.values() if not p.status.is_terminal]
        return newest_first(running)[::-1]

    async def request_cancel(self, program_id: str) -> None:
        self._cancels.add(program_id)

    async def cancel_requested(self, program_id: str) -> bool:
        return program_id in self._cancels

    async def close(self) -> None:
        return None


def newest_first(programs: Iterable[Program]) -> list[Program]:
    return sorted(programs, key=lambda p: (p.created_at_s, p.id), reverse=True)
