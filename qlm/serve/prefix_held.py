"""`PublishedPlan.prefix_held` for the live loop: per queued request shown to agents, the
prompt tokens each instance on its model holds, from the prefix keys agents report
(InstanceStatus.prefix_keys; qlm/agents/prefix_affinity.py reads the result).

The loop publishes every round, and the agents' reports change far less often than that: a
request's answer is kept until the reports change, so a round costs the requests new to the
queue, not the whole queue (a batch job's thousands of prompts were walked block by block
every round)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from qlm.agents.prefix_affinity import HeldByReports
from qlm.control.plan import PublishedPlan
from qlm.queue.records import InstanceStatus
from qlm.types import Request


class PrefixHeld:
    """The loop's `prefix_held`, kept between rounds while the reports stay the same."""

    def __init__(self) -> None:
        self._reports: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
        self._walkers: dict[str, HeldByReports] = {}  # by model
        self._held: dict[str, dict[str, int]] = {}  # request id -> instance -> tokens

    def on(
        self, view: PublishedPlan, queued: Sequence[Request], statuses: Sequence[InstanceStatus]
    ) -> PublishedPlan:
        """The view with `prefix_held` for its members whose prompt prefix some instance on
        their model reports holding (`statuses`: the instances that are up)."""
        reports = tuple(
            (s.instance_id, s.model, tuple(s.prefix_keys))
            for s in statuses
            if s.prefix_keys and s.model is not None
        )
        if not reports:
            return view
        if reports != self._reports or len(self._held) > 2 * len(queued) + 1024:
            self._renew(reports)
        members = {rid for group in view.groups.values() for rid in group.request_ids}
        held: dict[str, dict[str, int]] = {}
        known, walkers = self._held, self._walkers
        for request in queued:
            if request.prefix and request.id in members and request.model in walkers:
                tokens = known.get(request.id)
                if tokens is None:
                    tokens = known[request.id] = walkers[request.model].held(request.prefix)
                if tokens:
                    held[request.id] = tokens
        return replace(view, prefix_held=held)

    def _renew(self, reports: tuple[tuple[str, str, tuple[int, ...]], ...]) -> None:
        reported: dict[str, dict[str, frozenset[int]]] = {}  # model -> instance -> keys
        for instance_id, model, keys in reports:
            reported.setdefault(model, {})[instance_id] = frozenset(keys)
        self._reports = reports
        self._walkers = {model: HeldByReports(by_id) for model, by_id in reported.items()}
        self._held = {}
