"""The live plane's prefix knowledge: what each agent reports of its engine's prefix cache,
and what the control loop tells every agent from those reports.

**An agent's own view** (`AgentPrefixes`). The agent keeps a `PrefixIndex` of its own instance
(every pulled request's prompt-prefix blocks; forgotten on a model load) and reports its keys
in its InstanceStatus; the control loop turns every instance's report into the plan's
`prefix_held` (`PrefixHeld`, below), which each agent reads to order, and hold back, its
dispatch queue (qlm/prefixes/affinity.py). A pull that sent new blocks makes the next status
report go out early (at most every `EARLY_REPORT_S`), so that the others see it soon.

**The loop's `prefix_held`** (`PrefixHeld`): per queued request shown to agents, the prompt
tokens each instance on its model holds, from the prefix keys agents report
(InstanceStatus.prefix_keys; qlm/prefixes/affinity.py reads the result).

The loop publishes every round (on every queue change), and with five agents reporting every
half second some instance's report changes almost every round, though by a few keys: the
blocks its last pulls brought in and those its cache let go. So the answers are kept per
instance and brought up to date by difference: a request shown for the first time is walked
once per instance of its model; a report that changes re-walks only the shown prompts that
hold one of the keys it gained or lost (an index from block key to the shown requests with
that block). Renewing every answer on any report's change cost 29 % of the plane's CPU on
wc-quick's mega prompts (100 blocks each); renewing an instance's answers on its own
report's change still cost 16 %.

Pure: the reports come in as `Reported` (InstanceStatus fits it) and the answers go out as
a mapping, so that this package depends on neither the queue's records nor the plan's type.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Protocol

from qlm.perf.profile import Profile
from qlm.prefixes.affinity import HeldByReports, PrefixAffinity, Queued
from qlm.prefixes.index import PrefixIndex
from qlm.types import PrefixBlock, Request

# request id -> instance id -> prompt tokens that instance holds (PublishedPlan.notes.prefix_held)
HeldTokens = Mapping[str, Mapping[str, int]]


class Reported(Protocol):
    """What `PrefixHeld` reads of an instance's status report (qlm.queue.records.InstanceStatus)."""

    @property
    def instance_id(self) -> str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def prefix_keys(self) -> tuple[int, ...]: ...


EARLY_REPORT_S = 0.1


class AgentPrefixes:
    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id
        self._index: PrefixIndex | None = None
        self._deferred: dict[str, float] = {}  # request -> when this agent first held it back
        self.changed = False  # blocks sent since the last report

    def pulled(self, requests: Iterable[Request], kv_capacity_tokens: int) -> None:
        for request in requests:
            if not request.prefix:
                continue
            if self._index is None:
                self._index = PrefixIndex([(self.instance_id, kv_capacity_tokens)])
            self._index.record(self.instance_id, request.prefix)
            self.changed = True

    def forget(self) -> None:
        """The engine loads another model: its cache is gone."""
        if self._index is not None:
            self._index.forget(self.instance_id)
            self.changed = True

    def report(self) -> tuple[int, ...]:
        """The keys for this status report (InstanceStatus.prefix_keys)."""
        self.changed = False
        return () if self._index is None else self._index.keys(self.instance_id)

    def affinity(
        self,
        held: HeldTokens,
        profile: Profile | None,
        now_s: float,
        pool: Collection[str] | None = None,
    ) -> PrefixAffinity[Queued] | None:
        """Locality over the plan's `prefix_held` (None when it lists nothing); `pool`: the
        instances on the model, as the agent's reports show them (owner_side)."""
        if not held or profile is None:
            return None
        return PrefixAffinity(
            self.instance_id,
            lambda item: held.get(item.request_id),
            profile.prefill_s,
            self._deferred,
            now_s,
            pool,
        )


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
        self, members: set[str], queued: Sequence[Request], statuses: Sequence[Reported]
    ) -> dict[str, dict[str, int]]:
        """`prefix_held` for the shown requests (`members`: the ids the view shows agents) whose
        prompt prefix some instance on their model reports holding (`statuses`: the instances
        that are up)."""
        shown = [r for r in queued if r.prefix and r.id in members]
        self._untrack({r.id for r in shown})
        self._update(statuses)
        self._track(shown)
        if not self._by_instance:
            return {}
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
        return held

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

    def _update(self, statuses: Sequence[Reported]) -> None:
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
