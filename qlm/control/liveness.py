"""Which instances are up, judged by whether their agents keep reporting.

An agent reports its instance's status every `status_every_s`; one that was killed (with its
engine) stops. Its last report stays in the queue and still says what the instance looked like
(often: idle, room for more), so a planner that believed it would keep sending work to an
instance that will never pull it. The control loop plans only onto instances heard from within
`timeout_s`.

Silence is measured on the controller's own monotonic clock: a report counts as new when its
`at_s` differs from the last one seen, whatever the agent's clock says, so clock skew between
agents and the controller cannot make a live instance look dead or the reverse. Every
configured instance counts as heard from when the tracker starts, which gives agents that
start together with the controller `timeout_s` to report for the first time.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class _Heard:
    report_at_s: float | None  # the agent's timestamp of the last report seen (None: none yet)
    seen_at_s: float  # controller time when that report was first seen


class InstanceLiveness:
    """Tracks report times per instance; `update` returns the instances that are up."""

    def __init__(self, instance_ids: Iterable[str], timeout_s: float, now_s: float) -> None:
        if not timeout_s > 0:
            raise ValueError("timeout_s must be > 0")
        self.timeout_s = timeout_s
        self._heard = {i: _Heard(None, now_s) for i in instance_ids}

    def update(self, reports: Iterable[tuple[str, float]], now_s: float) -> frozenset[str]:
        """Note (instance id, report at_s) pairs seen at controller time now_s; the ids of
        the instances heard from within timeout_s. Reports of unknown instances are kept
        too (an instance may be added to the fleet while the loop runs)."""
        for instance_id, report_at_s in reports:
            heard = self._heard.get(instance_id)
            if heard is None or heard.report_at_s != report_at_s:
                self._heard[instance_id] = _Heard(report_at_s, now_s)
        return frozenset(
            i for i, heard in self._heard.items() if now_s - heard.seen_at_s < self.timeout_s
        )
