"""SharedEngineModel: an engine on GPUs that other engines use too (an instance group's
`slices`; the simulator's qlm/sim/sharing.py hands out the shares).

Question answered: what changes for an engine that shares its GPUs? Two things, both set from
outside as the other engines come and go:

* compute, by turns: `take_turns(n)` while n engines of the GPUs are busy, every iteration
  planned from then on takes n times its profile's time (`Profile.slowed`);
* KV memory, pooled (as kvcached pools it): `lend_kv(tokens)` sets how many KV tokens the
  engine may hold from now on. Its weights stay in its own share of the memory (the instance's
  gpu_memory_bytes), so every model fits whatever the others load; the longest sequence is
  still bounded by that share (vLLM's max_model_len does not move either). A capacity that
  shrinks cuts the iterations in flight, and the next plan preempts what no longer fits; one
  that grows takes effect at the next plan.

`kv_held(now_s)` is what it holds: the KV of its sequences, decode steps in flight counted,
cached prefix blocks no sequence uses not (they are evicted before anything is preempted).
With one turn and nothing lent it is an EngineModel.
"""

from __future__ import annotations

from qlm.engine.model.core import EngineModel


class SharedEngineModel(EngineModel):
    """An EngineModel whose compute turns and KV capacity are set from outside."""

    _turns = 1  # busy engines taking turns on the GPUs, this one included

    @property
    def turns(self) -> int:
        return self._turns

    def take_turns(self, engines: int, now_s: float) -> None:
        """From now_s, `engines` busy engines (this one included) share the GPUs by turns."""
        self._begin(now_s)
        if engines != self._turns:
            plan_s = self._interrupt(now_s)
            self._turns = engines
            if self._model is not None:
                self._profile = self._profiles[self._model].slowed(engines)
            self._resume(plan_s)

    def kv_held(self, now_s: float) -> int:
        """KV tokens its sequences hold at now_s (module docstring)."""
        self._advance(now_s)
        queues = self._queues
        done = self._decode_steps_in_flight(now_s)
        return queues.kv.used_tokens - queues.prefix.idle_tokens + done * queues.decode.num_seqs

    def lend_kv(self, capacity_tokens: int, now_s: float) -> None:
        """From now_s the engine may hold `capacity_tokens` KV tokens (module docstring)."""
        self._begin(now_s)
        kv = self._queues.kv
        if capacity_tokens > kv.capacity_tokens:
            kv.capacity_tokens = capacity_tokens
            self._resume(now_s)  # an engine idle for want of room starts
        elif capacity_tokens < kv.capacity_tokens:
            plan_s = self._interrupt(now_s)
            kv.capacity_tokens = capacity_tokens
            self._resume(plan_s)

    def _install(self, model: str) -> None:
        super()._install(model)
        if self._turns > 1:
            self._profile = self._profiles[model].slowed(self._turns)
