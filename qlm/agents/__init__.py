"""Per-instance agents: turn a published plan into LLM serving operations (LSOs).

The pure reconcile step (plan + observed engine state -> actions) and its adapters arrive with
the simulator and the live control plane; the action vocabulary is shared already.
"""

from qlm.agents.actions import Action, Evict, LoadModel, Pull, SwapKv

__all__ = ["Action", "Evict", "LoadModel", "Pull", "SwapKv"]
