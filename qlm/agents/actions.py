"""LSOs as frozen values: what an agent asks its engine to do."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class Pull:
    """Admit queued requests into the engine."""

    instance_id: str
    request_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Evict:
    """Preempt running requests and return them to the global queue. `for_request_ids`:
    the queued requests the room is freed for (none for a model swap); a live agent claims
    them from the global queue first and preempts only if it got one, so two instances that
    see the same blocked head do not both preempt for it."""

    instance_id: str
    request_ids: tuple[str, ...]
    reason: str
    for_request_ids: tuple[str, ...] = ()


class KvDirection(StrEnum):
    TO_CPU = "to_cpu"
    TO_GPU = "to_gpu"


@dataclass(frozen=True, slots=True)
class SwapKv:
    """Move requests' KV cache between GPU and CPU memory. `for_request_ids`: as `Evict`'s,
    for a swap to CPU that frees room."""

    instance_id: str
    request_ids: tuple[str, ...]
    direction: KvDirection
    for_request_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class LoadModel:
    """Switch the instance to another model; it serves nothing meanwhile."""

    instance_id: str
    model: str


@dataclass(frozen=True, slots=True)
class FetchStandby:
    """Read a model's weights into a free place of the instance's standby tier while it
    serves another (a later swap to it wakes it instead of loading it cold;
    qlm/agents/warming.py decides, qlm/engine/model/tiers.py keeps the tier); `replacing`: the
    sleeping model whose place it takes (it goes cold at once), when the tier has none free."""

    instance_id: str
    model: str
    replacing: str | None = None


Action = Pull | Evict | SwapKv | LoadModel | FetchStandby


def lso_steps(
    actions: Sequence[Action], held: Sequence[str], model: str | None
) -> tuple[Action, ...]:
    """The actions as an engine carries them out, one primitive each, for the live agent and
    the simulator alike. The rules, stated once:

    * a LoadModel first evicts everything the engine holds (back to the global queue, counted
      as evictions), then loads; the engine serves nothing until the load completes;
    * a LoadModel of the model already loaded, or loading, does nothing (as the engines do:
      the simulator counted a second one in the same round as a second swap, 18 of many:5's
      59).

    `held`: the requests the engine holds; `model`: the model it serves or loads."""
    steps: list[Action] = []
    for action in actions:
        if isinstance(action, LoadModel):
            if action.model == model:
                continue  # it serves or loads that model already
            if held:
                reason = f"model swap to {action.model}"
                steps.append(Evict(action.instance_id, tuple(held), reason))
                held = ()
            model = action.model
        steps.append(action)
    return tuple(steps)
