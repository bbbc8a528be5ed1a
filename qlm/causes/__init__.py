"""Why a request missed its SLO, in one place: the classifier both planes share
(classify.py), the live plane's facts for it (live.py) and the dashboard's table of recent
late requests (late.py). The simulator's facts are qlm/sim/miss_causes.py (from its
RequestOutcome). README.md lists the causes."""

from qlm.causes.classify import MissCause, MissFacts, classify_miss

__all__ = ["MissCause", "MissFacts", "classify_miss"]
