"""Which prompts open with the same text? Shared prefixes of a stream's prompts.

Two sources, set per stream (`prefixes:`):

* ``shared``: a tree of shared texts, one level after another (a system prompt, then tool
  descriptions, then a document, ...). Each level has `count` distinct texts of `tokens`
  tokens under every text of the level above, chosen by Zipf popularity (text k, from 0,
  with weight 1 / (k + 1)^zipf). A request's prompt is its chosen texts, in level order,
  followed by its own part (the length its `lengths` source draws). Streams with the same
  `namespace` (default: the stream's name) and levels draw from the same texts.
* ``trace``: the block ids of the trace rows the lengths come from (the Mooncake traces'
  hash_ids, one per 512-token block, the last one partial): the prompt's blocks as they were.

Either way a request carries `Request.prefix`: its leading blocks, each keyed by the prompt up
to its end (a key is a hash of the block's id and the key before it), so equal keys mean equal
text so far (qlm/prefixes/cache.py).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Annotated, Literal

import numpy as np
import numpy.typing as npt
from pydantic import Field

from qlm.config import StrictModel
from qlm.sim.traces import Trace
from qlm.types import PrefixBlock

IntArray = npt.NDArray[np.int64]
Blocks = tuple[PrefixBlock, ...]


class PrefixLevel(StrictModel):
    """One level of shared text."""

    name: str = Field(min_length=1, description="What the text is (for reading only).")
    count: int = Field(ge=1, le=1_000_000, description="Texts under each text above.")
    tokens: int = Field(ge=1, le=1_000_000, description="Each text's length.")
    zipf: float = Field(default=1.0, ge=0, le=10, description="Popularity exponent; 0: uniform.")


class SharedPrefixes(StrictModel):
    source: Literal["shared"]
    levels: tuple[PrefixLevel, ...] = Field(min_length=1, max_length=8)
    namespace: str | None = Field(default=None, min_length=1, description="Default: stream.")


class TracePrefixes(StrictModel):
    """The block ids of the trace rows the stream's lengths come from (format mooncake)."""

    source: Literal["trace"]


Prefixes = Annotated[SharedPrefixes | TracePrefixes, Field(discriminator="source")]


def _stable_key(text: str) -> int:
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def chain_keys(root: int, ids: tuple[int, ...]) -> tuple[int, ...]:
    """Each block's key: a hash of its id and the key before it (ints hash alike in every
    process)."""
    keys = []
    key = root
    for block_id in ids:
        key = hash((key, block_id))
        keys.append(key)
    return tuple(keys)


class PrefixSampler:
    """Draws one stream's prefixes from its own generator."""

    def __init__(self, spec: SharedPrefixes | TracePrefixes, stream: str, rng: np.random.Generator):
        self.spec = spec
        self.rng = rng
        namespace = spec.namespace if isinstance(spec, SharedPrefixes) else None
        self.root = _stable_key(namespace or stream)
        self._popularity = (
            [_zipf(level.count, level.zipf) for level in spec.levels]
            if isinstance(spec, SharedPrefixes)
            else []
        )

    def draw(
        self, prompts: IntArray, rows: Trace | None, taken: IntArray | None
    ) -> tuple[IntArray, list[Blocks]]:
        """(the prompts with their shared text in front, each request's prefix blocks) for
        requests whose own lengths are `prompts` (trace rows `taken` of `rows`)."""
        spec = self.spec
        if isinstance(spec, SharedPrefixes):
            return self._shared(spec, prompts)
        assert rows is not None
        assert rows.blocks is not None
        assert taken is not None
        size = rows.block_tokens
        out = []
        for prompt, row in zip(prompts.tolist(), taken.tolist(), strict=True):
            ids = rows.blocks[row][: -(-prompt // size)]
            keys = chain_keys(self.root, ids)
            out.append(
                tuple(PrefixBlock(k, min(size, prompt - i * size)) for i, k in enumerate(keys))
            )
        return prompts, out

    def _shared(self, spec: SharedPrefixes, prompts: IntArray) -> tuple[IntArray, list[Blocks]]:
        n = len(prompts)
        picks = [
            self.rng.choice(level.count, size=n, p=p).tolist() if level.count > 1 else [0] * n
            for level, p in zip(spec.levels, self._popularity, strict=True)
        ]
        tokens = [level.tokens for level in spec.levels]
        out = []
        for j in range(n):
            keys = chain_keys(self.root, tuple(pick[j] for pick in picks))
            out.append(tuple(PrefixBlock(k, t) for k, t in zip(keys, tokens, strict=True)))
        return prompts + sum(tokens), out


def _zipf(count: int, exponent: float) -> npt.NDArray[np.float64]:
    weights: npt.NDArray[np.float64] = 1.0 / np.arange(1, count + 1, dtype=np.float64) ** exponent
    weights /= weights.sum()
    return weights


def oracle_hits(prefixes: Iterable[Blocks]) -> list[int]:
    """Per request, in arrival order, the prefix tokens one infinite cache would hold at its
    admission: its leading blocks that earlier requests carried (a cache holds a block only
    once a prefill computed it, so no engine's cache holds more)."""
    seen: set[int] = set()
    hits = []
    for blocks in prefixes:
        hit = 0
        leading = True
        for block in blocks:
            if leading and block.key in seen:
                hit += block.tokens
            else:
                leading = False
                seen.add(block.key)
        hits.append(hit)
    return hits


def oracle_reuse(prefixes: list[tuple[int, Blocks]]) -> tuple[int, int]:
    """(prompt tokens, tokens one infinite cache would hold at admission) over requests in
    arrival order, each `(prompt tokens, its prefix blocks)` (`oracle_hits`)."""
    hits = oracle_hits(blocks for _, blocks in prefixes)
    return sum(prompt for prompt, _ in prefixes), sum(hits)
