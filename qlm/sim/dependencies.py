"""Requests that wait for others (a program's calls, qlm/programs): which arrive when.

Question answered: when does a dependent request reach the queue? A request with a
`Dependency` is not in the arrival schedule: it arrives `delay_s` after the last request it
waits for completed (0 for a program's call, which the server queues itself; a client's round
trip for the same call sent call by call). Its arrival moves to then; its deadlines move with
it when `shift_deadlines` (a call sent by a client, due by its class's targets from when it is
sent) and stay where they are otherwise (a program's call, due by the deadlines the program
gave it; a first token due before the arrival is due at the arrival). A request one of whose
inputs did not complete never arrives: `ended` names it, and those waiting for it, as failed.
Pure: the simulation schedules what it returns.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from qlm.types import Request


@dataclass(frozen=True, slots=True)
class Dependency:
    after: tuple[str, ...]
    delay_s: float = 0.0
    shift_deadlines: bool = False


class Releases:
    def __init__(self, requests: Sequence[Request], dependencies: Mapping[str, Dependency]):
        self._requests = {r.id: r for r in requests}
        self._deps = dict(dependencies)
        self._left: dict[str, set[str]] = {}
        self._children: dict[str, list[str]] = {}
        for rid, dep in self._deps.items():
            if rid not in self._requests:
                raise ValueError(f"a dependency names request {rid!r}, which is not in the run")
            unknown = [a for a in dep.after if a not in self._requests]
            if unknown:
                raise ValueError(f"request {rid} waits for unknown request {unknown[0]!r}")
            self._left[rid] = set(dep.after)
            for parent in dep.after:
                self._children.setdefault(parent, []).append(rid)
        self._check_acyclic()

    def _check_acyclic(self) -> None:
        """A cycle would never arrive (the run would stall): refuse it."""
        left = {rid: len(waits) for rid, waits in self._left.items()}
        ready = [rid for rid in self._requests if rid not in left]
        while ready:
            for child in self._children.get(ready.pop(), ()):
                left[child] -= 1
                if left[child] == 0:
                    ready.append(child)
        stuck = sorted(rid for rid, n in left.items() if n > 0)
        if stuck:
            raise ValueError(f"requests {stuck[:5]} wait for each other (a cycle)")

    def roots(self) -> list[Request]:
        """The requests that arrive when their own arrival says."""
        return [r for r in self._requests.values() if r.id not in self._deps]

    def ended(
        self, request_id: str, completed: bool, now_s: float
    ) -> tuple[list[Request], list[str]]:
        """The requests released by this one's end (with their new arrival and deadlines),
        and those that will never run because it did not complete (all waiting on it,
        directly or not)."""
        released: list[Request] = []
        failed: list[str] = []
        for child in self._children.get(request_id, ()):
            left = self._left.get(child)
            if left is None:
                continue  # failed already
            if not completed:
                failed += self._fail(child)
                continue
            left.discard(request_id)
            if not left:
                del self._left[child]
                released.append(self._moved(self._requests[child], now_s))
        return released, failed

    def _fail(self, request_id: str) -> list[str]:
        if self._left.pop(request_id, None) is None:
            return []
        out = [request_id]
        for child in self._children.get(request_id, ()):
            out += self._fail(child)
        return out

    def _moved(self, request: Request, now_s: float) -> Request:
        dep = self._deps[request.id]
        at_s = now_s + dep.delay_s
        if dep.shift_deadlines:
            shift_s = at_s - request.arrival_at_s
            done_s = request.completion_deadline_at_s
            return replace(
                request,
                arrival_at_s=at_s,
                ttft_deadline_at_s=request.ttft_deadline_at_s + shift_s,
                completion_deadline_at_s=None if done_s is None else done_s + shift_s,
            )
        ttft_s = max(at_s, request.ttft_deadline_at_s)
        done_s = request.completion_deadline_at_s
        return replace(
            request,
            arrival_at_s=at_s,
            ttft_deadline_at_s=ttft_s,
            completion_deadline_at_s=None if done_s is None else max(done_s, ttft_s),
        )
