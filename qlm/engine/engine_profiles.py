"""Which profiles an engine may serve: those of its instance's GPU type that fit it."""

from __future__ import annotations

from collections.abc import Iterable

from qlm.perf.profile import Profile
from qlm.types import Fleet, Instance


def profiles_for(instance: Instance, profiles: Fleet | Iterable[Profile]) -> dict[str, Profile]:
    """The profiles of the instance's GPU type that fit it, by model."""
    found: dict[str, Profile] = {}
    given = profiles.profiles.values() if isinstance(profiles, Fleet) else profiles
    for profile in given:
        if profile.gpu_type != instance.gpu_type:
            continue
        if profile.model in found:
            raise ValueError(f"two profiles for ({profile.model}, {profile.gpu_type})")
        if instance.gpu_count >= profile.gpu_count and profile.fits(instance.gpu_memory_bytes):
            found[profile.model] = profile
    if instance.loaded_model is not None and instance.loaded_model not in found:
        raise ValueError(
            f"instance {instance.id}: no profile that fits for its loaded model "
            f"{instance.loaded_model!r} on {instance.gpu_type}"
        )
    return found
