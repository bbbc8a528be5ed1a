"""Engines and the one engine performance model (Profile) they all share."""

from qlm.engine.profile import GIB, Profile

__all__ = ["GIB", "Profile"]
