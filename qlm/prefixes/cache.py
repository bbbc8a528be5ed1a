"""The engine model's prefix cache: prompt blocks kept in KV after their prefill, for reuse.

Question answered: which of a prompt's leading blocks does the engine already hold, what do
they occupy, and what goes when room is needed? Like vLLM's automatic prefix caching, at the
granularity of the request's own blocks (`Request.prefix`: a block's key names the prompt up
to its end, so a hit is always a run of leading blocks):

* a sequence admitted with its first k blocks cached holds a reference to each (they cannot
  be evicted while it runs) and computes only the rest of its prompt;
* when its prefill completes, its blocks not yet cached become entries it references (a
  block another sequence cached meanwhile is shared instead: its own copy is freed);
* when it finishes, is preempted to recompute, or is aborted, its references go; an entry no
  sequence references stays in KV, evictable, least recently used first. Blocks are released
  leaf first, so a prompt's later blocks are evicted before its earlier ones.

An entry's tokens count once in the KV cache however many sequences share it
(qlm/engine/model/kv_cache.py). Attention still reads the whole context of every sequence
(the step time's context term): reading a shared prefix once is the shared-prefix kernel's
business, not the cache's.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from qlm.types import PrefixBlock


@dataclass(slots=True)
class _Entry:
    tokens: int
    refs: int = 0


@dataclass(slots=True)
class PrefixCounters:
    """What the cache did since the engine was built (kept across model loads)."""

    prompt_tokens: int = 0  # prompt tokens of admitted sequences that carry a prefix
    hit_tokens: int = 0  # of those, found cached at admission (not computed)
    evicted_tokens: int = 0


class PrefixCache:
    """Cached prefix blocks of one loaded model, with their references and an LRU of the
    unreferenced ones."""

    def __init__(self, counters: PrefixCounters) -> None:
        self.counters = counters
        self._entries: dict[int, _Entry] = {}
        self._idle: OrderedDict[int, int] = OrderedDict()  # key -> tokens, oldest first
        self.tokens = 0  # KV tokens every entry holds
        self.idle_tokens = 0  # of those, held by entries no sequence references

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def match(self, prefix: Sequence[PrefixBlock]) -> int:
        """How many of the prompt's leading blocks are cached."""
        entries = self._entries
        for k, block in enumerate(prefix):
            if block.key not in entries:
                return k
        return len(prefix)

    def idle_within(self, prefix: Sequence[PrefixBlock], blocks: int) -> int:
        """Tokens of the first `blocks` blocks that are cached and unreferenced (what
        acquiring them takes out of the evictable pool)."""
        idle = self._idle
        return sum(idle.get(block.key, 0) for block in prefix[:blocks])

    def acquire(self, prefix: Sequence[PrefixBlock], blocks: int) -> int:
        """Reference the first `blocks` blocks (all cached); returns their tokens."""
        entries = self._entries
        return sum(self._take(block.key, entries[block.key]) for block in prefix[:blocks])

    def insert(self, prefix: Sequence[PrefixBlock], held: int) -> int:
        """A sequence holding references to its first `held` blocks computed the rest:
        cache (or share) them and reference them too; returns the tokens added to what it
        references."""
        added = 0
        for block in prefix[held:]:
            entry = self._entries.get(block.key)
            if entry is None:
                entry = self._entries[block.key] = _Entry(block.tokens)
                self.tokens += block.tokens
            added += self._take(block.key, entry)
        return added

    def _take(self, key: int, entry: _Entry) -> int:
        """One more reference to the entry (out of the evictable pool if it was there);
        returns its tokens."""
        if entry.refs == 0 and self._idle.pop(key, None) is not None:
            self.idle_tokens -= entry.tokens
        entry.refs += 1
        return entry.tokens

    def release(self, prefix: Sequence[PrefixBlock], blocks: int) -> None:
        """Drop one reference to each of the first `blocks` blocks, the last block first."""
        for block in reversed(prefix[:blocks]):
            entry = self._entries[block.key]
            entry.refs -= 1
            if entry.refs == 0:
                self._idle[block.key] = entry.tokens
                self.idle_tokens += entry.tokens

    def evict(self, tokens: int) -> int:
        """Evict unreferenced entries, least recently used first, until `tokens` are freed
        or none is left; returns the tokens freed."""
        freed = 0
        while freed < tokens and self._idle:
            key, size = self._idle.popitem(last=False)
            del self._entries[key]
            freed += size
        self.tokens -= freed
        self.idle_tokens -= freed
        self.counters.evicted_tokens += freed
        return freed
