"""Scheduling policies for the simulator, registered by name in SIM_POLICIES (README.md)."""

from qlm.sim.policies import (
    disagg,
    edf,
    fcfs,
    llmd,
    llmd_prefix,
    logos,
    preble,
    qlm,
    round_robin,
    serverless,
    shepherd,
)
from qlm.sim.policies.policy_base import (
    SIM_POLICIES,
    BasePolicy,
    SimContext,
    SimPolicy,
    make_policy,
)

__all__ = [
    "SIM_POLICIES",
    "BasePolicy",
    "SimContext",
    "SimPolicy",
    "disagg",
    "edf",
    "fcfs",
    "llmd",
    "llmd_prefix",
    "logos",
    "make_policy",
    "preble",
    "qlm",
    "round_robin",
    "serverless",
    "shepherd",
]
