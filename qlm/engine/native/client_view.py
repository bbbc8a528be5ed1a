"""A request the native engine holds, as its client sees it: tokens so far, the text streamed,
and where stop strings cut it.

Question answered: which text does a client receive, and when? The output is decoded whole at
each streaming point; what is streamed never changes afterwards, so the last characters are
held back while they could still change: a trailing replacement character (a character split
across tokens) and, when the request has stop strings, as many characters as the longest one
less one (a stop string that starts in them would cut them off). The final text is cut before
the first stop string.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenizers import Tokenizer

from qlm.types import Request

PARTIAL = "\ufffd"  # what a tokenizer decodes a character split across tokens to, for now


@dataclass(slots=True)
class LiveRequest:
    request: Request
    runner_id: str  # this submission's sequence in the runner (an id comes back after an abort)
    prompt_tokens: int
    max_tokens: int  # max_output_tokens as capped by the engine
    stops: tuple[str, ...]
    output: list[int] = field(default_factory=list)
    first_token_at_s: float | None = None
    sent_tokens: int = 0
    sent_text: str = ""

    @property
    def holdback(self) -> int:
        return max((len(stop) - 1 for stop in self.stops), default=0)

    def stop_at(self, text: str) -> int:
        """Where the first stop string starts in `text` (-1: none)."""
        return min((i for stop in self.stops if (i := text.find(stop)) >= 0), default=-1)

    def chunk(self, text: str, final: bool) -> tuple[str, int] | None:
        """(new text, new tokens) to stream now, if any; `final`: nothing is held back."""
        new_tokens = len(self.output) - self.sent_tokens
        visible = text
        if not final:
            visible = text[: len(text) - self.holdback] if self.holdback else text
            visible = visible.rstrip(PARTIAL)
        delta = visible[len(self.sent_text) :] if visible.startswith(self.sent_text) else ""
        if new_tokens <= 0 and not delta:
            return None
        self.sent_tokens = len(self.output)
        self.sent_text += delta
        return delta, new_tokens


def decode(tokenizer: Tokenizer | None, ids: list[int]) -> str:
    return "" if tokenizer is None else str(tokenizer.decode(ids, skip_special_tokens=True))
