"""A program's contexts (Parrot's context API over HTTP): named text whose KV an engine keeps,
that later generations continue from.

A context is its model and its whole text (its parent's text, then its own). `fill` queues a
one-token request for that text, so an engine computes it and keeps its blocks in its prefix
cache; `generate` queues a completion whose prompt is the context's text then the caller's,
with the context's text cut as whole prefix blocks (qlm/prefixes/prompt_blocks.py), so the
dispatch's prefix locality (qlm/prefixes/affinity.py: the index of where prefixes went) sends
it where the text was computed; `fork` names a child with the same text (it shares the
parent's blocks: nothing is computed); `free` forgets it (an engine's cache lets unused blocks
go by itself). Contexts end with their program. Frozen values, stored beside the program
(`ProgramStore.put_context`), never inside it: the program runner is the program's only
writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CONTEXT_MARK = "ctx"  # request ids: <program id>.ctx.<context>.<kind> (no call name has a dot)


@dataclass(frozen=True, slots=True)
class ProgramContext:
    name: str
    model: str
    text: str  # the whole text: the parent's, then its own
    parent: str | None
    created_at_s: float
    fill_request_id: str | None  # None: a fork (computes nothing)

    def request_id(self, program_id: str, kind: str) -> str:
        """The id of this context's fill (`kind` "fill") or of a generation (a unique hex)."""
        return f"{program_id}.{CONTEXT_MARK}.{self.name}.{kind}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "model": self.model,
            "text": self.text,
            "parent": self.parent,
            "created_at_s": self.created_at_s,
            "fill_request_id": self.fill_request_id,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ProgramContext:
        return cls(
            name=data["name"],
            model=data["model"],
            text=data["text"],
            parent=data.get("parent"),
            created_at_s=float(data["created_at_s"]),
            fill_request_id=data.get("fill_request_id"),
        )
