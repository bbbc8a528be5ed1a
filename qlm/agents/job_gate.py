"""May this planned batch job's request start on this engine now? (qlm/prefixes/job_plan.py)

A job's part shares a prefix; its first member, the leader, computes it. An engine caches a
prompt's blocks when its prefill ends, so a member admitted beside its leader would compute
the prefix again. `LeaderGate` holds a member back while its leader is queued (the leader
comes first in its part, so it goes in this round) or still prefilling on this engine, and
with it the job's requests after it in this instance's order (leaders excepted, which prefix
locality may rank after their members): the engine keeps its room
for the part it started, one part at a time as BatchLLM batches a group, rather than opening
more prefixes that would crowd that one's out of its cache. A program's call with a leader
(qlm/programs/fork.py: calls ready together that share their first text) but no job is held
back alone, nothing after it. Other requests pass untouched.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from qlm.agents.queued import QueuedItem
from qlm.engine.engine_types import EngineObservation


def prefilling_ids(observation: EngineObservation) -> frozenset[str]:
    """The engine's requests whose first token is not out yet."""
    return frozenset(r.request_id for r in observation.requests if not r.started)


class LeaderGate:
    """One dispatch round's gate: `saw` each queued request in schedule order, then `cut`
    the instance's ordered queue."""

    def __init__(self, prefilling: Collection[str]) -> None:
        self._prefilling = prefilling
        self._seen: set[str] = set()  # queued requests met so far
        self._blocked: set[str] = set()  # requests whose leader is queued or prefilling here
        self._stopped: set[str] = set()  # jobs cut from here on

    def saw(self, item: QueuedItem) -> bool:
        """Note a queued request; whether it is held back."""
        self._seen.add(item.request_id)
        leader = item.job_leader
        if leader is not None and (leader in self._seen or leader in self._prefilling):
            self._blocked.add(item.request_id)
            return True
        return False

    def cut(self, items: Sequence[QueuedItem]) -> list[QueuedItem]:
        """`items` (in the instance's order) less, per planned job, its requests from the
        first held-back one on (across calls: a job cut in one list is cut in the next)."""
        if not self._blocked:
            return list(items)
        kept = []
        owed: set[str] = set()  # leaders of members met already: they go wherever they are
        for item in items:
            if item.job_order is None:  # a program's call waiting for its fork's leader
                if item.request_id not in self._blocked:
                    kept.append(item)
                continue
            if item.request_id in owed:
                kept.append(item)
                continue
            job = item.job_order.rpartition("#")[0]
            if item.request_id in self._blocked:
                self._stopped.add(job)
                owed.add(item.job_leader or "")
                continue
            if job not in self._stopped:
                kept.append(item)
        return kept
