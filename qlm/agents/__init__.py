"""Per-instance agents: turn a published plan into LLM serving operations (LSOs).

The pure part, which the simulator's agents and the live ones both run: the dispatch decision
(decision.py, dispatch.py), the reconcile step (plan + observed engine state -> actions,
reconcile.py) and the action vocabulary (actions.py). Beside it, the live agent process
(agent.py and the files it names: events to queue writes, status reports, leases, standby
fetches). README.md lists both.
"""

from qlm.agents.actions import Action, Evict, LoadModel, Pull, SwapKv

__all__ = ["Action", "Evict", "LoadModel", "Pull", "SwapKv"]
