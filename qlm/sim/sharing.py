"""Engines that share GPUs (an instance group's `slices`): turns on the compute, and the KV
memory split or pooled.

Question answered: how fast does each engine on a shared GPU run right now, and how much KV
may it hold? Every engine keeps its own model's weights in its share of the memory
(Instance.gpu_memory_bytes), as separate vLLM servers with --gpu-memory-utilization split it,
so whatever the others load, its model fits.

* Compute is time-sliced: while n engines of one GPU set have iterations in flight, each
  iteration takes n times its profile's time (processor sharing; an engine alone runs at full
  speed). That is the pessimistic end: concurrent kernels (MPS) can overlap small batches.
* KV: by default each engine has what its share leaves beside its weights. With the group's
  `kv_pool` the engines draw from one pool (kvcached): the GPUs' usable memory less every
  loaded model's weights and every engine's KV in use; what is free is split evenly among
  the engines that hold a model, each may hold what it holds plus its part. An engine
  without a model leaves its whole share to the others; nothing is guaranteed, so a busy
  model can take most of the pool and a sibling's requests wait for room as it drains.

`SharedGpus.retime` runs after the simulator has polled the engines that changed: for each
GPU set touched it hands every engine its turns and, pooled, its KV capacity; the engines
that changed are polled again (their next event moved). Between two of these the capacities
stand, so the pool is never overdrawn (each engine grows into its own part only).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from qlm.perf.profile import DEFAULT_GPU_MEMORY_UTILIZATION, Profile
from qlm.sim.tracking import SimulationError, Slot


@runtime_checkable
class Sharer(Protocol):
    """An engine that can run slower and hold more or less KV as others share its GPUs
    (SimulatedEngine)."""

    @property
    def busy(self) -> bool: ...

    @property
    def profile(self) -> Profile | None: ...

    @property
    def turns(self) -> int: ...

    def take_turns(self, engines: int) -> None: ...

    @property
    def kv_capacity_tokens(self) -> int: ...

    def kv_held(self) -> int: ...

    def lend_kv(self, capacity_tokens: int) -> None: ...


class SharedGpus:
    """The GPU sets that several engines share, and each engine's turns and KV."""

    def __init__(self, slots: Iterable[Slot]) -> None:
        self._devices: dict[str, list[tuple[Slot, Sharer]]] = {}
        self._device_of: dict[str, str] = {}
        for slot in slots:
            device = slot.instance.device
            if device is None:
                continue
            engine = slot.engine
            if not isinstance(engine, Sharer):
                raise SimulationError(
                    f"instance {slot.id} shares GPUs ({device}) but its engine cannot take "
                    "turns on them (use the simulated engines)"
                )
            self._devices.setdefault(device, []).append((slot, engine))
            self._device_of[slot.id] = device

    def retime(self, touched: Iterable[str]) -> list[Slot]:
        """Hand the engines of every GPU set among `touched` (instance ids) their turns and
        KV; the slots whose engines changed."""
        if not self._devices:
            return []
        devices = {self._device_of[i] for i in touched if i in self._device_of}
        changed: dict[str, Slot] = {}
        for device in devices:
            members = self._devices[device]
            for slot in _hand_turns(members):
                changed[slot.id] = slot
            if members[0][0].instance.kv_pool:
                for slot in _lend_pool(members):
                    changed[slot.id] = slot
        return list(changed.values())


def _hand_turns(members: list[tuple[Slot, Sharer]]) -> list[Slot]:
    """Every engine of the GPU set takes as many turns as engines are busy (at least 1)."""
    turns = max(1, sum(1 for _, engine in members if engine.busy))
    changed = []
    for slot, engine in members:
        if engine.turns != turns:
            engine.take_turns(turns)
            changed.append(slot)
    return changed


def _lend_pool(members: list[tuple[Slot, Sharer]]) -> list[Slot]:
    """Split the pool's free bytes evenly among the engines with a model (module docstring)."""
    usable = 0.0
    holders: list[tuple[Slot, Sharer, Profile, int]] = []
    for slot, engine in members:
        instance, profile = slot.instance, engine.profile
        share = instance.gpu_memory_bytes * instance.gpu_count
        usable += share * (
            DEFAULT_GPU_MEMORY_UTILIZATION if profile is None else profile.gpu_memory_utilization
        )
        if profile is not None:
            held = engine.kv_held()
            usable -= profile.weight_bytes + held * profile.kv_bytes_per_token
            holders.append((slot, engine, profile, held))
    part = max(0.0, usable) / max(1, len(holders))
    changed = []
    for slot, engine, profile, held in holders:
        capacity = held + int(part // profile.kv_bytes_per_token)
        if capacity != engine.kv_capacity_tokens:
            engine.lend_kv(capacity)
            changed.append(slot)
    return changed
