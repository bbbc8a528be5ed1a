"""The prefill/decode split between two native runners (Prophet's and DistServe's
disaggregation; the simulator's model of it is qlm/sim/handoff.py).

Question answered: once one runner (the prefill side) has computed a sequence's prompt and
sampled its first token, what does another runner (the decode side) need to go on decoding it
as if it had been there from the start, and how does it get there without either side losing
anything when the other cannot take it?

* **What travels** (`KvHandoff`): the token ids (prompt, output so far), the K and V of every
  computed position for every layer (copied out of the prefill side's `KvCache` through its
  block table: the block sizes of the two sides need not match), the sampling settings and
  limits (max tokens, stop token ids, ignore_eos: `Sampling`), and the state of the request's
  random generator after the draws made so far, so a sampled (seeded) request makes on the
  decode side the draws it would have made on one runner (so the same tokens wherever the
  logits match: the same checkpoint and dtype on both sides).
* **Prefill side** (`PrefillSide`): `export` takes the sequence off the runner's schedule (it
  neither decodes nor is preempted meanwhile) and copies its K and V; its blocks stay held
  until the decode side answers: `landed` frees them, `refused` puts the sequence back where it
  was, as if nothing had happened (it then decodes on the prefill side, or is offered again).
* **Decode side** (`import_kv`): allocates blocks, copies the K and V into its cache and takes
  the sequence as running, computed up to the handed-over position, so its next step decodes
  it. Refused, changing nothing: OutOfBlocksError when the free blocks cannot hold the carried
  positions, ValueError for a model of another shape or an id or length it cannot take.

`hand_off` does the three in one process; kv_transport.py carries the payload between two.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qlm.engine.native.blocks import BlockTable, OutOfBlocksError
from qlm.engine.native.paged_sequence import Sampling, Seq
from qlm.engine.native.step_runner import NativeRunner


@dataclass(frozen=True, slots=True)
class KvHandoff:
    """One sequence on its way from a prefill runner to a decode runner. The tensors are
    float K and V of positions [0, computed_tokens), [num_layers, computed_tokens,
    num_kv_heads, head_dim] each; the last output token is not computed yet (the decode side's
    first step computes it and samples the next)."""

    seq_id: str
    prompt_ids: tuple[int, ...]
    output_ids: tuple[int, ...]  # sampled so far (the first token after a prefill)
    k_layer_token_head_dim: torch.Tensor
    v_layer_token_head_dim: torch.Tensor
    sampling: Sampling  # settings and limits: max_tokens counts output_ids too
    generator_state: torch.Tensor  # uint8: the request's generator after its draws so far

    @property
    def computed_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids) - 1

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V carried (tensor data only)."""
        k, v = self.k_layer_token_head_dim, self.v_layer_token_head_dim
        return k.numel() * k.element_size() + v.numel() * v.element_size()

    def __post_init__(self) -> None:
        if not self.prompt_ids or not self.output_ids:
            raise ValueError(f"hand-off {self.seq_id}: needs a prompt and a sampled token")
        k, v = self.k_layer_token_head_dim, self.v_layer_token_head_dim
        if k.dim() != 4 or k.shape != v.shape or k.shape[1] != self.computed_tokens:
            raise ValueError(
                f"hand-off {self.seq_id}: K {tuple(k.shape)} and V {tuple(v.shape)} do not "
                f"hold {self.computed_tokens} positions as [layers, tokens, kv heads, head dim]"
            )


@dataclass(frozen=True, slots=True)
class _InFlight:
    index: int  # its place in the running set it left
    seq: Seq


class PrefillSide:
    """The prefill runner's half of the split: sequences taken off its schedule while their
    K and V are in flight, their blocks held until the decode side answers."""

    def __init__(self, runner: NativeRunner) -> None:
        self.runner = runner
        self.in_flight: dict[str, _InFlight] = {}

    def export(self, seq_id: str) -> KvHandoff:
        """The hand-off of running `seq_id`, which must have sampled a token and computed all
        the others (right after the step that sampled it); ValueError otherwise."""
        runner = self.runner
        try:
            seq: Seq | None = runner.seq(seq_id)
        except KeyError:
            seq = None
        if seq is None or seq not in runner.running:
            raise ValueError(f"sequence {seq_id} is not running on the prefill side")
        if not seq.output or seq.pending != 1:
            raise ValueError(f"sequence {seq_id} has not just sampled a token (or is preempted)")
        slots = runner.pool.slots(seq.table, 0, seq.computed)
        handoff = KvHandoff(
            seq_id=seq_id,
            prompt_ids=seq.prompt,
            output_ids=tuple(seq.output),
            k_layer_token_head_dim=runner.cache.k[:, slots].clone(),
            v_layer_token_head_dim=runner.cache.v[:, slots].clone(),
            sampling=seq.sampling,
            generator_state=seq.generator.get_state(),
        )
        index, seq = runner.detach(seq_id)
        self.in_flight[seq_id] = _InFlight(index, seq)
        return handoff

    def landed(self, seq_id: str) -> None:
        """The decode side took `seq_id`: its blocks here are freed."""
        gone = self.in_flight.pop(seq_id)
        self.runner.pool.free(gone.seq.table)

    def refused(self, seq_id: str) -> None:
        """The decode side could not take `seq_id`: it is back in the running set where it
        was, with its blocks, as before `export`."""
        back = self.in_flight.pop(seq_id)
        self.runner.adopt(back.seq, min(back.index, len(self.runner.running)))


def import_kv(runner: NativeRunner, handoff: KvHandoff) -> None:
    """Take `handoff` on the decode runner `runner`, running (or waiting for a sequence slot,
    its blocks held), its next step a decode. OutOfBlocksError when the free blocks cannot
    hold its positions, ValueError when its shape, id or length does not fit: nothing
    changed on either."""
    shape = runner.model.shape
    k = handoff.k_layer_token_head_dim
    want = (shape.num_layers, handoff.computed_tokens, shape.num_kv_heads, shape.head_dim)
    if tuple(k.shape) != want:
        raise ValueError(
            f"hand-off {handoff.seq_id}: K and V of shape {tuple(k.shape)}, this model's are {want}"
        )
    runner.check_new(handoff.seq_id, len(handoff.prompt_ids), handoff.sampling)
    table = BlockTable()
    count = handoff.computed_tokens
    needed = runner.pool.blocks_for(count)
    if needed > runner.pool.free_blocks:
        raise OutOfBlocksError(
            f"decode side: sequence {handoff.seq_id} needs {needed} KV blocks for its "
            f"{count} tokens, {runner.pool.free_blocks} are free"
        )
    runner.pool.grow(table, count, runner.cache)
    slots = runner.pool.slots(table, 0, count)
    runner.cache.k[:, slots] = k.to(runner.cache.k.dtype)
    runner.cache.v[:, slots] = handoff.v_layer_token_head_dim.to(runner.cache.v.dtype)
    table.num_tokens = count
    seq = Seq(
        handoff.seq_id,
        handoff.prompt_ids,
        handoff.sampling,
        table,
        output=list(handoff.output_ids),
        computed=count,
        queued_step=runner.steps,
    )
    seq.generator.set_state(handoff.generator_state)
    runner.adopt(seq)


def hand_off(prefill: PrefillSide, decode: NativeRunner, seq_id: str) -> KvHandoff:
    """Move `seq_id` from the prefill side to the decode runner in one process: its
    payload once it landed (its blocks on the prefill side freed); the decode side's refusal
    raised with both sides as they were."""
    handoff = prefill.export(seq_id)
    try:
        import_kv(decode, handoff)
    except (OutOfBlocksError, ValueError):
        prefill.refused(seq_id)
        raise
    prefill.landed(seq_id)
    return handoff
