"""Incremental detokenization that survives moving a stream between agents.

vLLM's own incremental detokenizer, given the tokens already generated as part of a resumed
prompt, may repeat or drop text at the seam (measured: 29 of 105 resumes of the tiny model
differed). Here the text is a pure function of the completion's token ids: the client sees
`decode(ids)` delivered in pieces, text that would end in an unfinished UTF-8 character is
held back, and a resumed stream starts from exactly the text the client already has.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT_CHAR = "\ufffd"

Decode = Callable[[Sequence[int]], str]


class IncrementalDetokenizer:
    """Turns a growing list of completion token ids into text deltas."""

    def __init__(self, decode: Decode, token_ids: Sequence[int] = (), text: str = "") -> None:
        """Start empty, or (resuming) after `token_ids` whose text `text` was already sent."""
        self._decode = decode
        self.token_ids: list[int] = list(token_ids)
        self.text = text
        # decode(token_ids[:_stable_ids]) == text[:_stable_chars]: decoding restarts there.
        self._stable_ids = 0
        self._stable_chars = 0

    def push(self, new_ids: Sequence[int]) -> str:
        """Add generated ids; return the text they complete ("" while a character is unfinished)."""
        self.token_ids.extend(new_ids)
        tail = self._decode(self.token_ids[self._stable_ids :])
        if tail.endswith(REPLACEMENT_CHAR):
            return ""
        return self._advance(tail)

    def flush(self) -> str:
        """At the end of the stream: the rest of the text, unfinished characters and all."""
        return self._advance(self._decode(self.token_ids[self._stable_ids :]))

    def _advance(self, tail: str) -> str:
        delta = tail[len(self.text) - self._stable_chars :]
        self.text += delta
        self._stable_ids = len(self.token_ids)
        self._stable_chars = len(self.text)
        return delta
