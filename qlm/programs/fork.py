"""Which of a program's calls compute a shared context first? (Parrot's fork: fill the context
once, then run the calls that continue it.)

Calls that become ready together and whose prompts start with the same text (a paper every
map call reads) would each compute that text when they run side by side: an engine caches a
prompt's blocks only when its prefill ends. `leaders` names, for each call, the first call
before it (in program order) that it shares at least `MIN_SHARED_TOKENS` leading tokens with
(whole prefix blocks, qlm/prefixes/prompt_blocks.py) and that waits for no one itself; it
waits for that leader (`Request.job_leader`: the dispatch's `LeaderGate`,
qlm/agents/job_gate.py, holds a request back while its leader is queued or prefilling on the
same engine, in both planes), then finds the text cached. Calls that share less (a short
template head such as "Summarise: ") go side by side: waiting would cost more than the
prefill it saves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from qlm.types import PrefixBlock

# One whole block of the API's cut (256 characters at about 4 a token): less is not worth a wait.
MIN_SHARED_TOKENS = 64


def shared_tokens(a: Sequence[PrefixBlock], b: Sequence[PrefixBlock]) -> int:
    """Tokens of the leading blocks two prompts have in common."""
    total = 0
    for x, y in zip(a, b, strict=False):
        if x.key != y.key:
            break
        total += x.tokens
    return total


def leaders(prefixes: Mapping[str, tuple[PrefixBlock, ...]]) -> dict[str, str]:
    """Call -> the call it waits for, among calls ready together given by their prompt
    blocks in program order (module docstring)."""
    out: dict[str, str] = {}
    firsts: list[str] = []  # calls that lead (or go alone), in order
    for name, blocks in prefixes.items():
        leader = next(
            (f for f in firsts if shared_tokens(prefixes[f], blocks) >= MIN_SHARED_TOKENS), None
        )
        if leader is None:
            firsts.append(name)
        else:
            out[name] = leader
    return out
