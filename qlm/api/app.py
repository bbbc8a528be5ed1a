"""The HTTP API of the live control plane: OpenAI-compatible completions plus QLM's SLO tags,
asynchronous submission and request state. Stateless: every replica talks to the same queue.

    app = create_app(settings, queue, clock)
    uvicorn.run(app, host=..., port=...)

The caller owns the queue (creates it before and closes it after serving).
"""

from __future__ import annotations

from fastapi import FastAPI

from qlm.api.context import ApiContext
from qlm.api.errors import install_error_handlers
from qlm.api.openai_routes import add_openai_routes
from qlm.api.qlm_routes import add_qlm_routes
from qlm.api.settings import ApiSettings
from qlm.api.tokens import TokenCounter
from qlm.clock import Clock
from qlm.queue.base import GlobalQueue


def create_app(
    settings: ApiSettings,
    queue: GlobalQueue,
    clock: Clock,
    *,
    token_counter: TokenCounter | None = None,
) -> FastAPI:
    """An app serving `settings.models` from `queue`; deadlines are read from `clock`.
    `token_counter` overrides the registered counter named in the settings (e.g. a real
    tokenizer)."""
    context = ApiContext.build(settings, queue, clock, token_counter)
    app = FastAPI(title="QLM", summary="SLO-aware queue for LLM serving fleets")
    install_error_handlers(app)
    add_openai_routes(app, context)
    add_qlm_routes(app, context)
    return app
