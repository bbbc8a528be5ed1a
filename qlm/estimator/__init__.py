"""Waiting-time estimation (QLM's RWT estimator) and its extension point."""

from qlm.estimator.estimator_base import ESTIMATORS, WaitEstimator, make_estimator
from qlm.estimator.rwt import (
    GroupCost,
    GroupEstimate,
    QueueEstimate,
    RwtEstimator,
    ServiceRates,
    Violation,
)

__all__ = [
    "ESTIMATORS",
    "GroupCost",
    "GroupEstimate",
    "QueueEstimate",
    "RwtEstimator",
    "ServiceRates",
    "Violation",
    "WaitEstimator",
    "make_estimator",
]
