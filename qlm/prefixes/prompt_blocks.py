"""Which leading blocks of a prompt could another prompt share? `Request.prefix` for requests
that come through the API.

The API holds the prompt's text, not the engine's tokens, so it cuts the text into blocks of
`PREFIX_BLOCK_CHARS` characters (as llm-d's approximate prefix index hashes prompts in
character blocks) and keys each block by a hash of the text from the start to the block's end:
equal keys, equal text so far. A block carries its share of the prompt's token count (the
counter's, rounded down, so the blocks never hold more than the prompt). The trailing part
shorter than a block is the request's own. Routers and engine models read these blocks
(qlm/prefixes/index.py, qlm/prefixes/cache.py); real engines cache by their own
tokens.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

from qlm.types import PrefixBlock

PREFIX_BLOCK_CHARS = 256
MAX_PREFIX_BLOCKS = 512  # at most this many (a 128k-character prompt), to keep records small


def prompt_prefix(
    prompt: str | None,
    prompt_tokens: int,
    block_chars: int = PREFIX_BLOCK_CHARS,
    cuts: tuple[int, ...] = (),
) -> tuple[PrefixBlock, ...]:
    """The prompt's whole blocks of `block_chars` characters, keyed by the text up to their
    end, each with its share of `prompt_tokens`; () for no prompt or one shorter than a
    block. `cuts`: more places where a block ends (a program's template ends its shared text
    at its first variable: Parrot's prefix at the variable boundary), so that the text up to
    there is a block other prompts with the same head share."""
    if not prompt or prompt_tokens < 1:
        return ()
    whole = min(len(prompt) // block_chars, MAX_PREFIX_BLOCKS)
    ends: Iterable[int] = range(block_chars, whole * block_chars + 1, block_chars)
    if cuts:  # only programs' calls have them: the admission path stays a plain range
        limit = min(len(prompt), MAX_PREFIX_BLOCKS * block_chars)
        ends = sorted({*ends, *(c for c in cuts if 0 < c <= limit)})
    per_char = prompt_tokens / len(prompt)
    digest = hashlib.blake2b(digest_size=8)
    blocks, start = [], 0
    for end in ends:
        tokens = math.floor(end * per_char) - math.floor(start * per_char)
        if tokens < 1:
            continue  # less than a token: its text joins the next block
        digest.update(prompt[start:end].encode())
        blocks.append(PrefixBlock(int.from_bytes(digest.copy().digest(), "little"), tokens))
        start = end
    return tuple(blocks)
