"""QLM: an SLO-aware queue-management control plane for LLM serving fleets.

The package is a functional core (grouping, estimation, planning, reconcile) with I/O
adapters at the edges. See docs/design/ and each extension point's README.
"""

__version__ = "0.1.0"
