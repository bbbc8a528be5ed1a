"""What a live agent keeps of its engine between rounds, beyond the requests it holds.

* `ModelLoads`: the model loads it started and saw end (when each began, whether from the
  standby tier), for the model-load share of a request's queue wait and the load time left.
* `RefillBacklog`: how many requests to admit beyond the engine's sequence slots. A sequence
  that ends leaves its slot idle until the agent's next round pulls a request and the engine
  admits it: a round trip per completion, which a burst of short requests pays every time a
  batch ends together. Requests waiting inside the engine take such a slot at the engine's
  next step instead. In `auto` the backlog is as many as ended between two of the agent's
  rounds, the last time any did: measured, so it needs no profile and follows the workload
  (a batch that ends together, one at a time under steady arrivals; nothing before the
  first completion). Only requests that outrank nothing in the engine wait there, and an
  urgent arrival preempts them first (`reconcile.Budget`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Container, Sequence
from typing import Literal

from qlm.causes.live import overlap_s
from qlm.engine.engine_types import EngineEvent, RequestFinished

LOADS_KEPT = 64  # recent model loads, for the model_load share of a result's queue wait


class ModelLoads:
    def __init__(self) -> None:
        self._started: dict[str, float] = {}  # model -> when this agent started loading it
        self.warm = False  # the last load began from the standby tier (a wake)
        self._done: deque[tuple[str, float, float]] = deque(maxlen=LOADS_KEPT)

    def started(self, model: str, at_s: float, *, warm: bool) -> None:
        self._started[model] = at_s
        self.warm = warm

    def ended(self, model: str, at_s: float, load_s: float) -> None:
        start_s = self._started.pop(model, at_s - load_s)
        self._done.append((model, start_s, at_s))

    def started_at_s(self, model: str | None, default_s: float) -> float:
        return self._started.get(model or "", default_s)

    def wait_s(self, model: str, arrival_s: float, dispatched_s: float) -> float:
        """Of a request's wait from `arrival_s` to `dispatched_s`, the time this instance
        spent loading `model`."""
        loads = ((start_s, end_s) for m, start_s, end_s in self._done if m == model)
        return overlap_s(arrival_s, dispatched_s, loads)


class RefillBacklog:
    def __init__(self, setting: int | Literal["auto"]) -> None:
        self._fixed = None if setting == "auto" else setting
        self._ended = 0  # sequences that ended in the last round any did

    def saw(self, events: Sequence[EngineEvent], held: Container[str]) -> None:
        """A round's events: the completions of requests this agent holds."""
        ended = sum(isinstance(e, RequestFinished) and e.request_id in held for e in events)
        if ended:
            self._ended = ended

    @property
    def size(self) -> int:
        return self._ended if self._fixed is None else self._fixed
