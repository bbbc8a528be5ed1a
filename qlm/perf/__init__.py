"""The one engine performance model: per (model, GPU type) profile of step times, KV capacity
and model load time, read by the simulated and emulated engines and by the estimator.

A leaf package: it imports nothing else of qlm, so qlm.types (Fleet holds profiles) can use it
without a cycle."""

from qlm.perf.profile import GIB, Profile
from qlm.perf.step import DecodeRun, StepTime

__all__ = ["GIB", "DecodeRun", "Profile", "StepTime"]
