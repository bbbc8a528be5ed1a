"""`PublishedPlan.prefix_held` for the live loop: per queued request shown to agents, the
prompt tokens each instance on its model holds, from the prefix keys agents report
(InstanceStatus.prefix_keys; qlm/agents/prefix_affinity.py reads the result).

The loop publishes every round (on every queue change), and with five agents reporting every
half second some instance's report changes almost every round, though by a few keys: the
blocks its last pulls brought in and those its cache let go. So the answers are kept per
instance and brought up to date by difference: a request shown for the first time is walked
once per instance of its model; a report that changes re-walks only the shown prompts that
hold one of the keys it gained or lost (an index from block key to the shown requests with
that block). Renewing every answer on any report's change cost 29 % of the plane's CPU on
wc-quick's mega prompts (100 blocks each); renewing an instance's answers on its own
report's change still cost 16 %."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

from qlm.agents.prefix_affinity import HeldByReports
from qlm.control.plan import PublishedPlan
from qlm.queue.records import InstanceStatus
from qlm.types import PrefixBlock, Request


class _Reported:
    """One instance's report and its answers: request id -> tokens held, for the tracked
    requests of its model that it holds some of (absent: none)."""

    __slots__ = ("answers", "instance_id", "keys", "model", "walker")

    def __init__(self, instance_id: str, model: str, keys: frozenset[int]) -> None:
        self.instance_id = instance_id
        self.model = model
        self.keys = keys
        self.walker = HeldByReports({instance_id: keys})  # its memo holds for these keys only
        self.answers: dict[str, int] = {}

    def answer(self, request_id: str, prefix: Sequence[PrefixBlock]) -> None:
        tokens = self.walker.held(prefix).get(self.instance_id, 0)
        if tokens:
            self.answers[request_id] = tokens
        else:
            self.answers.pop(request_id, None)


class PrefixHeld:
    """The loop's `prefix_held`, brought up to date by difference each round."""

    def __init__(self) -> None:
        self._by_instance: dict[str, _Reported] = {}
        self._tracked: dict[str, Request] = {}  # shown requests with a prompt prefix
        self._index: dict[int, set[str]] = {}  # block key -> tracked requests with it

    def on(
        self, view: PublishedPlan, queued: Sequence[Request], statuses: Sequence[InstanceStatus]
    ) -> PublishedPlan:
        """The view with `prefix_held` for its members whose prompt prefix some instance on
        their model reports holding (`statuses`: the instances that are up)."""
        members = {rid for group in view.groups.values() for rid in group.request_ids}
        shown = [r for r in queued if r.prefix and r.id in members]
        self._untrack({r.id for r in shown})
        self._update(statuses)
        self._track(shown)
        if not self._by_instance:
            return view
        by_model: dict[str, list[_Reported]] = {}
        for reported in self._by_instance.values():
            by_model.setdefault(reported.model, []).append(reported)
        held: dict[str, dict[str, int]] = {}
        for request in shown:
            tokens = {
                r.instance_id: r.answers[request.id]
                for r in by_model.get(request.model, ())
                if request.id in r.answers
            }
            if tokens:
                held[request.id] = tokens
        return replace(view, prefix_held=held)

    def _untrack(self, shown: set[str]) -> None:
        """Forget the requests no longer shown (pulled, or past the cut)."""
        for request_id in [rid for rid in self._tracked if rid not in shown]:
            request = self._tracked.pop(request_id)
            for block in request.prefix:
                ids = self._index.get(block.key)
                if ids is not None:
                    ids.discard(request_id)
                    if not ids:
                        del self._index[block.key]
            for reported in self._by_instance.values():
                reported.answers.pop(request_id, None)

    def _track(self, shown: Iterable[Request]) -> None:
        """Walk the requests shown for the first time, once per instance of their model."""
        for request in shown:
            if request.id in self._tracked:
                continue
            self._tracked[request.id] = request
            for block in request.prefix:
                self._index.setdefault(block.key, set()).add(request.id)
            for reported in self._by_instance.values():
                if reported.model == request.model:
                    reported.answer(request.id, request.prefix)

    def _update(self, statuses: Sequence[InstanceStatus]) -> None:
        """Each instance's report against the last: the same, answers kept; new (or another
        model), every tracked request of its model walked; other keys, only the requests
        with a block among the keys gained or lost walked again."""
        now: dict[str, _Reported] = {}
        for s in statuses:
            if not s.prefix_keys or s.model is None:
                continue
            keys = frozenset(s.prefix_keys)
            known = self._by_instance.get(s.instance_id)
            if known is not None and known.model == s.model and known.keys == keys:
                now[s.instance_id] = known
                continue
            fresh = now[s.instance_id] = _Reported(s.instance_id, s.model, keys)
            if known is None or known.model != s.model:
                todo: Iterable[str] = list(self._tracked)
            else:
                fresh.answers = known.answers
                todo = {rid for key in known.keys ^ keys for rid in self._index.get(key, ())}
            for request_id in todo:
                request = self._tracked[request_id]
                if request.model == s.model:
                    fresh.answer(request_id, request.prefix)
        self._by_instance = now
