"""Planning: virtual queues over instances (QLM's global scheduler) and its baselines."""

from qlm.solver.policies import (
    PLANNERS,
    EdfPlanner,
    FcfsPlanner,
    MilpPlanner,
    Planner,
    make_planner,
)
from qlm.solver.types import GroupPrediction, Plan, PlanInput, PlanStatus

__all__ = [
    "PLANNERS",
    "EdfPlanner",
    "FcfsPlanner",
    "GroupPrediction",
    "MilpPlanner",
    "Plan",
    "PlanInput",
    "PlanStatus",
    "Planner",
    "make_planner",
]
