"""Which of a program's calls compute a shared context first? (Parrot's fork: fill the context
once, then run the calls that continue it.)

Calls that become ready together and whose prompts start with the same text (a paper every
map call reads) would each compute that text when they run side by side: an engine caches a
prompt's blocks only when its prefill ends. `leaders` names, for each such group, its first
call in program order as the leader; the others wait for it (`Request.job_leader`: the
dispatch's `LeaderGate`, qlm/agents/job_gate.py, holds a request back while its leader is
queued or prefilling on the same engine, in both planes), then find the text cached. Calls
that share less than one whole prefix block go as they are.
"""

from __future__ import annotations

from collections.abc import Mapping

from qlm.types import PrefixBlock


def leaders(prefixes: Mapping[str, tuple[PrefixBlock, ...]]) -> dict[str, str]:
    """Call -> the call it waits for, among calls ready together given by their prompt
    blocks in program order: those whose first block is another's wait for the first of
    them."""
    first_of: dict[int, str] = {}
    out: dict[str, str] = {}
    for name, blocks in prefixes.items():
        if not blocks:
            continue
        key = blocks[0].key
        leader = first_of.setdefault(key, name)
        if leader != name:
            out[name] = leader
    return out
