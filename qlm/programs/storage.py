"""Where programs live: the `ProgramStore` protocol, and the embedded store.

The API writes a program when it is submitted; the program runner (qlm/api/program_runner.py)
is its only writer afterwards. A cancel is a flag of its own (`request_cancel`), which the
runner reads, so that it never races the runner's writes; so are a program's contexts
(qlm/programs/program_contexts.py), which the API writes and the runner drops when the program ends.
The Redis store
(qlm/queue/redis/program_store.py) keeps the same in the queue's Redis, so that programs
survive a restart of every process.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Protocol

from qlm.programs.program_contexts import ProgramContext
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
    async def put_context(self, program_id: str, context: ProgramContext) -> None: ...
    async def contexts(self, program_id: str) -> dict[str, ProgramContext]:
        """The program's contexts by name (qlm/programs/program_contexts.py)."""
        ...

    async def drop_contexts(self, program_id: str, names: Collection[str] | None = None) -> int:
        """Forget these contexts (None: all of the program's); how many there were."""
        ...

    async def close(self) -> None: ...


class MemoryProgramStore:
    """The embedded store: in this process, gone with it (like the memory queue)."""

    def __init__(self) -> None:
        self._programs: dict[str, Program] = {}
        self._cancels: set[str] = set()
        self._contexts: dict[str, dict[str, ProgramContext]] = {}

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

    async def put_context(self, program_id: str, context: ProgramContext) -> None:
        self._contexts.setdefault(program_id, {})[context.name] = context

    async def contexts(self, program_id: str) -> dict[str, ProgramContext]:
        return dict(self._contexts.get(program_id, {}))

    async def drop_contexts(self, program_id: str, names: Collection[str] | None = None) -> int:
        mine = self._contexts.get(program_id, {})
        gone = list(mine) if names is None else [n for n in names if n in mine]
        for name in gone:
            del mine[name]
        return len(gone)

    async def close(self) -> None:
        return None


def newest_first(programs: Iterable[Program]) -> list[Program]:
    return sorted(programs, key=lambda p: (p.created_at_s, p.id), reverse=True)
