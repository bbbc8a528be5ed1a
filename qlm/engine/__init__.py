"""Engines and the one engine performance model (Profile) they all share.

Only the profile and step-time types are exported here: qlm.types imports this package, so
the engines (which import qlm.types) are imported from their modules: qlm.engine.model
(EngineModel, EngineConfig), qlm.engine.simulated, qlm.engine.emulated, qlm.engine.library.
"""

from qlm.engine.profile import GIB, Profile
from qlm.engine.step import DecodeRun, StepTime

__all__ = ["GIB", "DecodeRun", "Profile", "StepTime"]
