"""How the simulator carries out LSOs on its engines: the same primitives, by the same rules
(qlm.agents.actions.lso_steps), as the live agents. A request a policy pulls leaves the global
queue and is held by its instance's engine; an instance asked for something no engine can do
(an unknown instance, a model it cannot hold, a pull while loading) is a policy bug and stops
the run (SimulationError)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence

from qlm.agents.actions import (
    Action,
    Evict,
    FetchStandby,
    KvDirection,
    LoadModel,
    Pull,
    SwapKv,
    lso_steps,
)
from qlm.clock import Clock
from qlm.engine.client import StandbyFetcher
from qlm.sim.tracking import SimulationError, Slot, Track
from qlm.sim.waits import WaitLedger
from qlm.types import Fleet, Request


class LsoApplier:
    """Applies actions to the run's engines; marks every instance it touches as dirty (its
    engine must be polled), counts model loads per instance in `swaps`, and tells the wait
    ledger when a request leaves the queue or an instance's model changes."""

    def __init__(
        self,
        fleet: Fleet,
        slots: Mapping[str, Slot],
        queued: MutableMapping[str, Request],
        tracks: Mapping[str, Track],
        dirty: MutableMapping[str, Slot],
        swaps: MutableMapping[str, int],
        clock: Clock,
        ledger: WaitLedger,
    ) -> None:
        self._fleet = fleet
        self._slots = slots
        self._queued = queued
        self._tracks = tracks
        self._dirty = dirty
        self._swaps = swaps
        self._clock = clock
        self._ledger = ledger
        self._appliers: dict[type, Callable[[Action], None]] = {
            Pull: self._pull,
            Evict: self._evict,
            SwapKv: self._swap_kv,
            LoadModel: self._load_model,
            FetchStandby: self._fetch_standby,
        }

    def apply(self, actions: Sequence[Action]) -> None:
        for action in actions:
            for step in self._steps(action):
                self._appliers[type(step)](step)

    def _steps(self, action: Action) -> tuple[Action, ...]:
        """The primitives an action comes down to (qlm.agents.actions.lso_steps, the rules
        the live agents follow too)."""
        if not isinstance(action, LoadModel):
            return (action,)
        slot = self._slot_for(action)
        return lso_steps((action,), tuple(slot.held), slot.model)

    def _slot_for(self, action: Action) -> Slot:
        slot = self._slots.get(action.instance_id)
        if slot is None:
            raise SimulationError(f"{action}: unknown instance")
        self._dirty[slot.id] = slot
        return slot

    def _pull(self, action: Action) -> None:
        assert isinstance(action, Pull)
        slot = self._slot_for(action)
        if slot.loading or slot.model is None:
            raise SimulationError(f"{action}: instance {slot.id} is not ready")
        now_s = self._clock.now_s()
        for request_id in action.request_ids:
            request = self._queued.pop(request_id, None)
            if request is None:
                continue  # taken meanwhile; the live queue's pull answers the same way
            if request.model != slot.model:
                raise SimulationError(f"{action}: {request_id} needs {request.model}")
            track = self._tracks[request_id]
            track.holder = slot
            track.dispatch_s = now_s
            self._ledger.dequeue(track)
            slot.held[request_id] = track
            slot.engine.submit(request)

    def _evict(self, action: Action) -> None:
        assert isinstance(action, Evict)
        slot = self._slot_for(action)
        ids = [r for r in action.request_ids if r in slot.held and r not in slot.evicting]
        if ids:
            slot.evicting.update(ids)
            slot.engine.abort(ids)

    def _swap_kv(self, action: Action) -> None:
        assert isinstance(action, SwapKv)
        slot = self._slot_for(action)
        ids = [r for r in action.request_ids if r in slot.held]
        if not ids:
            return
        if action.direction is KvDirection.TO_CPU:
            slot.engine.swap_out(ids)
        else:
            slot.engine.swap_in(ids)

    def _load_model(self, action: Action) -> None:
        assert isinstance(action, LoadModel)
        slot = self._slot_for(action)
        if not self._fleet.can_serve(slot.instance, action.model):
            raise SimulationError(f"{action}: instance cannot hold {action.model}")
        slot.engine.load_model(action.model)  # lso_steps evicted what it held
        slot.model = action.model
        slot.loading = True
        slot.load_started_s = self._clock.now_s()
        self._ledger.slot_changed(slot)
        self._swaps[slot.id] += 1

    def _fetch_standby(self, action: Action) -> None:
        assert isinstance(action, FetchStandby)
        slot = self._slot_for(action)
        if not isinstance(slot.engine, StandbyFetcher):
            raise SimulationError(f"{action}: the engine has no standby tier to fill")
        slot.engine.fetch_standby(action.model, action.replacing)
