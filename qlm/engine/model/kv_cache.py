"""KV cache accounting of the engine model, on the GPU and in CPU swap space.

Question answered: how many KV tokens are in use, reserved and free, and how many have moved
between GPU and CPU since the last iteration was planned? Token granularity, no blocks. The GPU
holds the decode batch's context (prompt + output of every decoding sequence, which grows a
token per sequence per step without passing through here) plus a reservation for every
admitted prefill: its whole prefill + 1 token (vLLM v0 style), so prefill chunks never run out
of room, and the prefix cache's blocks (qlm/prefixes/cache.py), once each however many sequences
share them (the decode batch's `shared_tokens` are the part of its context those blocks hold).
Cached blocks no sequence references count as used here; they are evicted before anything is
preempted (scheduler.py). Swap traffic is charged to the next iteration (segment.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from qlm.engine.model.decode_batch import DecodeBatch
from qlm.prefixes.cache import PrefixCache


@dataclass(slots=True)
class KvCache:
    """KV tokens of one engine: GPU capacity and use, CPU swap space and use."""

    decode: DecodeBatch  # whose context is the KV the decoding sequences hold
    prefix: PrefixCache  # whose blocks hold the shared part of that context, and more
    capacity_tokens: int = 0
    cpu_capacity_tokens: int = 0
    reserved_tokens: int = 0  # reserved for admitted prefills (+1 each)
    cpu_used_tokens: int = 0
    swap_traffic_tokens: int = 0  # moved since the last iteration was planned

    @property
    def used_tokens(self) -> int:
        own = self.decode.context_tokens - self.decode.shared_tokens
        return own + self.reserved_tokens + self.prefix.tokens

    @property
    def free_tokens(self) -> int:
        return self.capacity_tokens - self.used_tokens

    @property
    def decode_slots_short(self) -> bool:
        """The next decode step has no KV slot for every decoding sequence."""
        return self.decode.num_seqs > self.free_tokens

    @property
    def room_after_decodes(self) -> int:
        """KV tokens free once this iteration's decodes have their slots."""
        return self.free_tokens - self.decode.num_seqs

    def decode_steps_until_full(self) -> int:
        """Decode steps the batch can take before the cache is full (the batch is not
        empty)."""
        return self.free_tokens // self.decode.num_seqs

    @property
    def cpu_free_tokens(self) -> int:
        return self.cpu_capacity_tokens - self.cpu_used_tokens

    def reserve_prefill(self, prefill_tokens: int) -> None:
        self.reserved_tokens += prefill_tokens + 1

    def release_prefill(self, prefill_tokens: int) -> None:
        self.reserved_tokens -= prefill_tokens + 1

    def swap_to_cpu(self, tokens: int) -> None:
        self.cpu_used_tokens += tokens
        self.swap_traffic_tokens += tokens

    def swap_to_gpu(self, tokens: int) -> None:
        self.cpu_used_tokens -= tokens
        self.swap_traffic_tokens += tokens

    def free_cpu(self, tokens: int) -> None:
        """Drop KV held on CPU (an aborted swapped sequence): no traffic."""
        self.cpu_used_tokens -= tokens

    def take_swap_traffic(self) -> int:
        """The KV tokens moved since the last call (what the next iteration pays for)."""
        tokens, self.swap_traffic_tokens = self.swap_traffic_tokens, 0
        return tokens
