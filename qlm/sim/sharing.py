"""Engines that share GPUs (an instance group's `slices`): they take turns on the compute.

Question answered: how fast does each engine on a shared GPU run right now? Every engine
holds its own model in its share of the memory (Instance.gpu_memory_bytes), so memory is
split statically, as separate vLLM servers with --gpu-memory-utilization split it. Compute
is time-sliced: while n engines of one device have iterations in flight, each iteration
takes n times its profile's time (processor sharing; an engine alone runs at full speed).
That is the pessimistic end: concurrent kernels (MPS) can overlap small decode batches.

`SharedGpus.retime` runs after the simulator has polled the engines that changed: it counts
the busy engines of each device touched and hands every engine of that device its number of
turns; an engine whose number changed re-plans its iterations from now, and the simulator
polls it again (its next event moved).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol, runtime_checkable

from qlm.sim.tracking import SimulationError, Slot


@runtime_checkable
class TurnTaking(Protocol):
    """An engine that can run slower while others share its GPUs (SimulatedEngine)."""

    @property
    def busy(self) -> bool: ...

    def take_turns(self, engines: int) -> None: ...


class SharedGpus:
    """The devices that several engines share, and the turns each engine takes."""

    def __init__(self, slots: Iterable[Slot]) -> None:
        self._devices: dict[str, list[tuple[Slot, TurnTaking]]] = {}
        self._device_of: dict[str, str] = {}
        self._turns: dict[str, int] = {}
        for slot in slots:
            device = slot.instance.device
            if device is None:
                continue
            engine = slot.engine
            if not isinstance(engine, TurnTaking):
                raise SimulationError(
                    f"instance {slot.id} shares GPUs ({device}) but its engine cannot take "
                    "turns on them (use the simulated engines)"
                )
            self._devices.setdefault(device, []).append((slot, engine))
            self._device_of[slot.id] = device
            self._turns[slot.id] = 1

    def retime(self, touched: Iterable[str]) -> list[Slot]:
        """Hand the engines of every device among `touched` (instance ids) their turns; the
        slots whose engines changed speed."""
        if not self._devices:
            return []
        devices = {self._device_of[i] for i in touched if i in self._device_of}
        changed: list[Slot] = []
        for device in devices:
            members = self._devices[device]
            turns = max(1, sum(1 for _, engine in members if engine.busy))
            for slot, engine in members:
                if self._turns[slot.id] != turns:
                    self._turns[slot.id] = turns
                    engine.take_turns(turns)
                    changed.append(slot)
        return changed
