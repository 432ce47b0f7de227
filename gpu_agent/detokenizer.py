"""Incremental detokenization: streamed text that is exactly `decode(all ids)`, for every family.

The text of a reply is a pure function of its token ids, so a stream moved to another agent
continues exactly (vLLM's own incremental detokenizer, handed the tokens already generated as
part of a resumed prompt, repeated or dropped text at the seam: 29 of 105 resumes of the tiny
model differed). Decoding each step's ids alone is wrong for SentencePiece-style tokenizers:
their decoders drop the leading space of the first piece decoded (`Strip`, `Metaspace`), so
"▁recon" alone reads "recon". So each step decodes a short window of earlier ids together with
the new ones and emits what the new ones add, as vLLM's and Hugging Face's incremental
detokenizers do; the window restarts at each emission, so the cost of a step does not grow
with the stream.

Two things are held back until they are final:
- text ending in U+FFFD: an unfinished UTF-8 character (its next byte may complete it);
- a run of byte-fallback pieces (`<0xE6>`, Llama-2, Gemma): that decoder turns a whole run
  into text or, if any byte in it is invalid, into one U+FFFD per byte, so what a run reads
  depends on the byte pieces that follow it. Special tokens are left out before the decoder
  sees the pieces, so they do not end a run. A run's text goes out with the next other piece.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Sequence
from typing import Any, Protocol

REPLACEMENT_CHAR = "\ufffd"
MAX_UNFINISHED_CHARACTER_TOKENS = 4
"""A UTF-8 character has at most 4 bytes, so at most 4 trailing ids can leave it unfinished."""

Decode = Callable[[Sequence[int]], str]


class ResumeMismatch(ValueError):
    """The text a resumed stream's client has is not the text of the ids it says it has."""


class IncrementalDetokenizer:
    """Turns a growing list of completion token ids into text deltas.

    The deltas concatenate to `decode(ids)` (with `decode` the tokenizer's own decoding of the
    whole list), whatever the ids and however they are split into steps.
    """

    def __init__(
        self,
        decode: Decode,
        token_ids: Sequence[int] = (),
        text: str = "",
        *,
        held_ids: Collection[int] = frozenset(),
    ) -> None:
        """Start empty, or (resuming) after `token_ids` of which the client has the text `text`.

        `held_ids` are the ids whose text waits for what follows them: a byte-fallback
        tokenizer's byte pieces and the special tokens its decoding leaves out (see
        `held_token_ids`).
        """
        self._decode = decode
        self._held = held_ids
        self._ids: list[int] = list(token_ids)
        # ids[:_read] are decoded; ids[_prefix:_read] is the window of context for the next step
        # and `_prefix_text` its text when decoded alone.
        self._prefix = 0
        self._read = 0
        self._prefix_text = ""
        self._owed = ""  # decoded text the client does not have yet (after a resume)
        if self._ids:
            self._start_after(text)
        elif text:
            raise ResumeMismatch("a resume with text must carry the token ids it came from")

    def push(self, new_ids: Sequence[int]) -> str:
        """Add generated ids; return the text they complete ("" while it is not final yet)."""
        self._ids.extend(new_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """At the end of the stream: all the text not given out yet, unfinished bytes and all."""
        return self._advance(final=True)

    def _stable_end(self, final: bool) -> int:
        """How many ids have final text: all but a trailing run of held ids."""
        end = len(self._ids)
        if not final:
            while end > self._read and self._ids[end - 1] in self._held:
                end -= 1
        return end

    def _advance(self, *, final: bool) -> str:
        end = self._stable_end(final)
        if end <= self._read:
            return self._take_owed() if final else ""
        window = self._decode(self._ids[self._prefix : end])
        if not final and window.endswith(REPLACEMENT_CHAR):
            return ""
        delta = window[len(self._prefix_text) :]
        if delta:
            # The ids that brought this text are the next step's context: they decode to
            # something, so a decoder that strips a leading space strips theirs, not the next.
            self._prefix, self._prefix_text = self._read, self._decode(self._ids[self._read : end])
        else:
            self._prefix_text = window
        self._read = end
        return self._take_owed() + delta

    def _take_owed(self) -> str:
        owed, self._owed = self._owed, ""
        return owed

    def _start_after(self, client_text: str) -> None:
        """Set up after resumed ids: find their final text and what of it the client lacks."""
        ids = self._ids
        end = self._stable_end(final=False)
        decoded = self._decode(ids[:end])
        # Trailing ids that leave a character unfinished are decoded with what follows them.
        limit = max(0, end - MAX_UNFINISHED_CHARACTER_TOKENS)
        while decoded.endswith(REPLACEMENT_CHAR) and end > limit:
            end -= 1
            decoded = self._decode(ids[:end])
        if not decoded.startswith(client_text):
            # Or the client has every delta of a stream that ended, unfinished bytes flushed
            # as they were (only its `done` went missing): nothing is owed, nothing follows.
            end, decoded = len(ids), self._decode(ids)
            if decoded != client_text:
                raise ResumeMismatch("resume.text is not the text of resume.token_ids")
        self._owed = decoded[len(client_text) :]
        self._read = end
        # Context for the next step: back far enough to hold some text of its own.
        span = 1
        while end - span > 0 and not self._decode(ids[end - span : end]):
            span *= 2
        self._prefix = max(end - span, 0)
        self._prefix_text = self._decode(ids[self._prefix : end])


class BackendTokenizer(Protocol):
    """What `held_token_ids` reads of a `tokenizers.Tokenizer`."""

    @property
    def decoder(self) -> Any:
        """The decoder (its state is its JSON)."""
        ...

    def get_vocab(self, with_added_tokens: bool = True) -> dict[str, int]:
        """Piece → id."""
        ...

    def get_added_tokens_decoder(self) -> dict[int, Any]:
        """Id → added token (with its `special` flag)."""
        ...


BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")


def held_token_ids(tokenizer: BackendTokenizer) -> frozenset[int]:
    """The ids whose text waits for the next other id: byte pieces of a byte-fallback decoder.

    With them come the special tokens, which decoding leaves out, so they do not end a run of
    byte pieces. Byte-level tokenizers (Llama-3, Qwen) have none: their unfinished characters
    show as a trailing U+FFFD and are held back by that.
    """
    decoder = tokenizer.decoder
    if decoder is None or b'"ByteFallback"' not in decoder.__getstate__():
        return frozenset()
    pieces = {
        token_id
        for piece, token_id in tokenizer.get_vocab(with_added_tokens=False).items()
        if BYTE_PIECE.fullmatch(piece)
    }
    special = {
        token_id
        for token_id, added in tokenizer.get_added_tokens_decoder().items()
        if added.special
    }
    return frozenset(pieces | special)
