"""Per-model queues in earliest-TTFT-deadline order, for the baselines that keep their own
global queue (`edf`, `logos`): ties by arrival, then by the order requests joined; `fill`
pulls a queue's heads into an instance while its admission budget takes them."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Sequence

from qlm.agents.actions import Pull
from qlm.sim.policies.policy_base import NO_ACTIONS, Actions, AdmissionBook, SimContext
from qlm.types import Instance, Request

_Entry = tuple[float, float, int, Request]


class DeadlineQueues:
    def __init__(self) -> None:
        self._heaps: dict[str, list[_Entry]] = {}  # model -> deadline heap
        self._sequence = itertools.count()

    def push(self, request: Request) -> None:
        entry = (request.ttft_deadline_at_s, request.arrival_at_s, next(self._sequence), request)
        heapq.heappush(self._heaps.setdefault(request.model, []), entry)

    def head(self, model: str) -> Request | None:
        heap = self._heaps.get(model)
        return heap[0][3] if heap else None

    def count(self, model: str) -> int:
        return len(self._heaps.get(model, ()))

    def queued(self, model: str) -> Sequence[Request]:
        """The model's queued requests, in no particular order."""
        return [entry[3] for entry in self._heaps.get(model, ())]

    def models_by_head(self) -> list[str]:
        """The models with queued requests, the one whose head is due first first."""
        heads = sorted((heap[0][:3], model) for model, heap in self._heaps.items() if heap)
        return [model for _, model in heads]

    def pull_while(
        self, model: str, fits: Callable[[Request], bool], admit: Callable[[Request], None]
    ) -> list[Request]:
        """Take the model's heads, each admitted before the next is tried, while they fit."""
        heap = self._heaps.get(model)
        taken: list[Request] = []
        while heap and fits(heap[0][3]):
            request = heapq.heappop(heap)[3]
            admit(request)
            taken.append(request)
        return taken


def fill(
    ctx: SimContext, instance: Instance, queues: DeadlineQueues, book: AdmissionBook
) -> Actions:
    """Pull the earliest-deadline requests of the instance's model while they fit its
    admission budget (`book`); nothing while it loads or holds no model."""
    model = ctx.model_of(instance.id)
    if model is None or ctx.loading(instance.id):
        return NO_ACTIONS
    taken = queues.pull_while(
        model, lambda r: book.fits(instance.id, r), lambda r: book.admit(instance.id, r)
    )
    return (Pull(instance.id, tuple(r.id for r in taken)),) if taken else NO_ACTIONS
