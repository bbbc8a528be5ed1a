"""The live agent's settings (the fleet file's `agent:` section, `ServeConfig.agent`): how
often it wakes and reports, how long its leases last, what it may do to its engine and how
many requests wait inside the engine beyond its sequence slots. Reconcile's own options are
`ReconcileConfig` (qlm/agents/queued.py); `ReconcileConfig.of` builds them from these."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from qlm.config import StrictModel


class AgentConfig(StrictModel):
    poll_s: float = Field(
        default=0.25,
        gt=0,
        description="Longest sleep between agent rounds; engine events and new plans wake "
        "the agent before that.",
    )
    token_flush_s: float = Field(
        default=0.02,
        ge=0,
        description="Longest a streamed token chunk waits in the agent so that a request's "
        "tokens of several engine steps go out in one queue write (one Redis round trip, one "
        "SSE event); a first token, a request's end or any other engine event sends what is "
        "held at once. 0: every engine step's tokens are written as they come.",
    )
    lease_s: float = Field(
        default=30.0, gt=0, description="A pulled request returns to the queue if not renewed."
    )
    status_every_s: float = Field(default=0.5, gt=0, description="Instance status report period.")
    allow_evict: bool = True
    allow_model_swap: bool = True
    allow_kv_swap: bool = True

    max_dispatches: int = Field(
        default=3,
        ge=1,
        description="A request its engine aborted (not an eviction) this many times fails "
        "instead of going back to the queue again.",
    )
    engine_backlog: Annotated[int, Field(ge=0)] | Literal["auto"] = Field(
        default="auto",
        description="Requests admitted beyond the engine's sequence slots (they wait inside "
        "the engine, so a finished sequence is replaced at the engine's next step, not the "
        "agent's next round). auto: as many as ended between two agent rounds, the last "
        "time any did (qlm/agents/engine_loads.py); 0 keeps all waiting in the global queue.",
    )
