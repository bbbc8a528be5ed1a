"""`PublishedPlan.prefix_held` for the live loop: per queued request shown to agents, the
prompt tokens each instance on its model holds, from the prefix keys agents report
(InstanceStatus.prefix_keys; qlm/agents/prefix_affinity.py reads the result).

The loop publishes every round (on every queue change), and each agent's report changes far
less often than that, though with five agents reporting every half second some report
changes almost every round. So the answers are kept per instance: an instance's answer for a
request stands until that instance's report changes, and a round walks the prompts of the
requests new to the queue and, for an instance whose report changed, the shown prompts of its
model once (before, any report's change renewed every answer: on wc-quick's mega prompts,
100 blocks each, that walk was 29 % of the plane's CPU)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from qlm.agents.prefix_affinity import HeldByReports
from qlm.control.plan import PublishedPlan
from qlm.queue.records import InstanceStatus
from qlm.types import Request


class _Reported:
    """One instance's report and its answers: request id -> tokens held (0: none)."""

    __slots__ = ("answers", "keys", "model", "walker")

    def __init__(self, instance_id: str, model: str, keys: tuple[int, ...]) -> None:
        self.model = model
        self.keys = keys
        self.walker = HeldByReports({instance_id: frozenset(keys)})
        self.answers: dict[str, int] = {}


class PrefixHeld:
    """The loop's `prefix_held`, each instance's answers kept while its report stays."""

    def __init__(self) -> None:
        self._by_instance: dict[str, _Reported] = {}

    def on(
        self, view: PublishedPlan, queued: Sequence[Request], statuses: Sequence[InstanceStatus]
    ) -> PublishedPlan:
        """The view with `prefix_held` for its members whose prompt prefix some instance on
        their model reports holding (`statuses`: the instances that are up)."""
        self._update(statuses)
        if not self._by_instance:
            return view
        members = {rid for group in view.groups.values() for rid in group.request_ids}
        by_model: dict[str, list[tuple[str, _Reported]]] = {}
        for instance_id, reported in self._by_instance.items():
            by_model.setdefault(reported.model, []).append((instance_id, reported))
        held: dict[str, dict[str, int]] = {}
        for request in queued:
            if not request.prefix or request.id not in members:
                continue
            tokens: dict[str, int] = {}
            for instance_id, reported in by_model.get(request.model, ()):
                answer = reported.answers.get(request.id)
                if answer is None:
                    found = reported.walker.held(request.prefix)
                    answer = reported.answers[request.id] = found.get(instance_id, 0)
                if answer:
                    tokens[instance_id] = answer
            if tokens:
                held[request.id] = tokens
        self._forget(len(queued))
        return replace(view, prefix_held=held)

    def _update(self, statuses: Sequence[InstanceStatus]) -> None:
        """Keep each instance's answers while its report (model and keys) is the same."""
        now: dict[str, _Reported] = {}
        for s in statuses:
            if not s.prefix_keys or s.model is None:
                continue
            keys = tuple(s.prefix_keys)
            known = self._by_instance.get(s.instance_id)
            if known is not None and known.model == s.model and known.keys == keys:
                now[s.instance_id] = known
            else:
                now[s.instance_id] = _Reported(s.instance_id, s.model, keys)
        self._by_instance = now

    def _forget(self, queued: int) -> None:
        """Answers for requests long gone are dropped with the walker's memo (they are
        only ever looked up while queued)."""
        for instance_id, reported in self._by_instance.items():
            if len(reported.answers) > 2 * queued + 1024:
                self._by_instance[instance_id] = _Reported(
                    instance_id, reported.model, reported.keys
                )
