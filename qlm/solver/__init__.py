"""Planning: virtual queues over instances (QLM's global scheduler) and its baselines."""

from qlm.solver.plan_types import GroupPrediction, Plan, PlanInput, PlanStatus
from qlm.solver.policies import (
    PLANNERS,
    EdfPlanner,
    FcfsPlanner,
    MilpPlanner,
    Planner,
    make_planner,
)

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
