"""The estimator extension point: how long would each group wait on each instance?"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from qlm.config import EstimatorConfig
from qlm.estimator.rwt import GroupCost, QueueEstimate, RwtEstimator, Violation
from qlm.grouping.group import RequestGroup
from qlm.registry import Registry
from qlm.types import Fleet, Instance


class WaitEstimator(Protocol):
    def group_cost(self, group: RequestGroup, instance: Instance) -> GroupCost | None:
        """What the planner needs for one group on one instance; None if it cannot serve it."""
        ...

    def estimate_queue(
        self, queue: Sequence[RequestGroup], instance: Instance, busy_s: float = 0.0
    ) -> QueueEstimate: ...

    def violations(
        self, queue: Sequence[RequestGroup], estimate: QueueEstimate, now_s: float
    ) -> tuple[Violation, ...]: ...


ESTIMATORS: Registry[WaitEstimator] = Registry("estimator")
ESTIMATORS.register("rwt")(RwtEstimator)


def make_estimator(config: EstimatorConfig, fleet: Fleet) -> WaitEstimator:
    return ESTIMATORS.create(config.policy, config, fleet)
