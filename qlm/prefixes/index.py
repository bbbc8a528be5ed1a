"""What does each instance probably hold in its prefix cache? A model kept from routing alone.

Routers cannot see inside engines cheaply, so they keep their own model of each instance's
prefix cache from where they sent requests (llm-d's approximate prefix-cache index, Preble's
global radix tree): every request sent to an instance puts its prefix blocks there; each
instance holds at most `capacity_tokens` of them and forgets the least recently used first,
as the engine's cache does (qlm/prefixes/cache.py). An instance that loads another model
forgets everything. Pure; the simulator's policies and the live router use it alike.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable, Sequence
from dataclasses import dataclass, field

from qlm.types import PrefixBlock

# The most blocks an agent reports (InstanceStatus.prefix_keys): 1,024 blocks of a few hundred
# tokens cover the hot prefixes of a GPU's cache while keeping a report a few KiB.
REPORTED_KEYS = 1024


@dataclass(slots=True)
class _Held:
    capacity_tokens: int
    tokens: int = 0
    blocks: OrderedDict[int, int] = field(default_factory=OrderedDict)  # key -> tokens, LRU first


def leading_tokens(keys: Container[int], prefix: Sequence[PrefixBlock]) -> int:
    """Tokens of the prompt's leading blocks whose keys are in `keys` (keys are chained: a
    block held after one missing is another prompt's)."""
    tokens = 0
    for block in prefix:
        if block.key not in keys:
            break
        tokens += block.tokens
    return tokens


class PrefixIndex:
    """Per instance, the prefix blocks routed to it, least recently used first."""

    def __init__(self, capacities: Iterable[tuple[str, int]] = ()) -> None:
        self._held: dict[str, _Held] = {}
        for instance_id, capacity_tokens in capacities:
            self.add_instance(instance_id, capacity_tokens)

    def add_instance(self, instance_id: str, capacity_tokens: int) -> None:
        self._held[instance_id] = _Held(max(0, capacity_tokens))

    def matched_tokens(self, instance_id: str, prefix: Sequence[PrefixBlock]) -> int:
        """Tokens of the prompt's leading blocks the instance holds (0 for an unknown one)."""
        held = self._held.get(instance_id)
        return 0 if held is None else leading_tokens(held.blocks, prefix)

    def best(self, instance_ids: Iterable[str], prefix: Sequence[PrefixBlock]) -> dict[str, int]:
        """Matched tokens per instance."""
        return {i: self.matched_tokens(i, prefix) for i in instance_ids}

    def evicted_by(self, instance_id: str, tokens: int) -> list[tuple[int, int]]:
        """The blocks (key, tokens) the instance would forget to take `tokens` more, oldest
        first (none while it has room)."""
        held = self._held.get(instance_id)
        if held is None:
            return []
        over = held.tokens + tokens - held.capacity_tokens
        out = []
        for key, size in held.blocks.items():
            if over <= 0:
                break
            out.append((key, size))
            over -= size
        return out

    def record(self, instance_id: str, prefix: Sequence[PrefixBlock]) -> None:
        """A request with this prefix was sent to the instance: its blocks are the most
        recently used there (a prefix longer than the whole capacity keeps its head)."""
        held = self._held.get(instance_id)
        if held is None or not prefix:
            return
        blocks = held.blocks
        for block in reversed(prefix):  # the leading block ends most recent: evicted last
            size = blocks.pop(block.key, None)
            if size is not None:
                held.tokens -= size
            blocks[block.key] = block.tokens
            held.tokens += block.tokens
        while held.tokens > held.capacity_tokens and blocks:
            _, size = blocks.popitem(last=False)
            held.tokens -= size

    def keys(self, instance_id: str, limit: int = REPORTED_KEYS) -> tuple[int, ...]:
        """The instance's blocks, most recently used first, at most `limit`."""
        held = self._held.get(instance_id)
        if held is None:
            return ()
        out: list[int] = []
        for key in reversed(held.blocks):
            if len(out) >= limit:
                break
            out.append(key)
        return tuple(out)

    def forget(self, instance_id: str) -> None:
        """The instance dropped its cache (a model load)."""
        held = self._held.get(instance_id)
        if held is not None:
            held.blocks.clear()
            held.tokens = 0
