"""Parrot's context API on a native engine: Fill, Fork, Generate, Free.

Question answered: how does a caller that knows its calls share a prefix (a program's system
prompt and documents, an agent's history) compute that prefix once and continue from it many
times? A context is named text whose K and V the engine keeps: `fill` computes it (after a
parent context's tokens, sharing the parent's KV blocks without a copy), `fork` is a child
context of no more text (the blocks shared, nothing computed), `generate` submits a request
whose prompt continues the context (its events come through the engine's `poll` as any
request's), `free` gives the KV back. Contexts hold their KV until freed, unless the engine
runs out of blocks: then the earliest filled context's KV goes first (before any running
request is preempted) and what continues from it recomputes its tokens, so a context is always
valid, only sometimes slower.

The operations run between engine steps; `fill` waits until the context is computed.
"""

from __future__ import annotations

import asyncio

from qlm.engine.engine_types import EngineError
from qlm.engine.native.native_engine import CONTEXT_PREFIX, NativeEngine
from qlm.engine.native.step_runner import NativeRunner
from qlm.types import Request


class NativeContexts:
    def __init__(self, engine: NativeEngine) -> None:
        self.engine = engine

    async def fill(
        self, context_id: str, text: str, parent: str | None = None, timeout_s: float = 60.0
    ) -> int:
        """Compute `text` as context `context_id` (after `parent`'s tokens); the context's
        tokens once it is filled. EngineError for a taken id, an unknown parent, a context
        the cache cannot hold, or an engine that fails meanwhile."""
        tokens = self.engine.tokenize(text, first=parent is None)
        runner_id = CONTEXT_PREFIX + context_id
        parent_id = None if parent is None else CONTEXT_PREFIX + parent
        if parent is not None:
            self.engine.context_tokens(parent)  # EngineError when there is none
        errors: list[str] = []
        called: list[bool] = []  # the runner took the call (a taken id is refused only then)

        def call(runner: NativeRunner) -> None:
            try:
                runner.fill(runner_id, tokens, parent_id)
            except ValueError as exc:
                errors.append(str(exc).replace(CONTEXT_PREFIX, ""))
            called.append(True)

        self.engine.on_runner(call)
        async with asyncio.timeout(timeout_s):
            while True:
                if errors:
                    raise EngineError(f"context {context_id}: {errors[0]}")
                if not called:
                    self.engine.raise_if_failed()
                    await asyncio.sleep(0.002)
                    continue
                try:
                    return self.engine.context_tokens(context_id)
                except EngineError:
                    self.engine.raise_if_failed()
                    await asyncio.sleep(0.002)

    async def fork(self, context_id: str, parent: str) -> int:
        """A child context of `parent` sharing its KV; its tokens."""
        return await self.fill(context_id, "", parent)

    def generate(self, context_id: str, request: Request) -> None:
        """Submit `request`, its prompt continuing context `context_id`."""
        self.engine.submit(request, context_id)

    def free(self, context_id: str) -> None:
        """Give the context's KV back (children keep the blocks they share)."""
        self.engine.context_tokens(context_id)  # EngineError when there is none
        runner_id = CONTEXT_PREFIX + context_id

        def call(runner: NativeRunner) -> None:
            runner.abort(runner_id)

        self.engine.on_runner(call)
