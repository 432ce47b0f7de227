"""Tokenize a prompt only as far as it takes to know whether it fits the context.

A prompt of the most characters allowed can have tens of thousands of tokens; tokenizing all
of it to learn that it cannot fit a context of a few thousand costs a core for a tenth of a
second or more, per request. A prefix of the text that has more tokens than the context holds
proves the whole text has too: `encode_within` tokenizes growing prefixes, cut where the text
has white space, and stops at the first that is already too long. The cost of a request is
then bounded by the context, not by the prompt's size; a prompt that fits is tokenized whole,
as before.

Tokenizers split text into words before they merge its pieces, so a prefix cut before white
space has the same words as the whole text up to the cut, and no more tokens than the text
has up to there; `CUT_SLACK_TOKENS` covers what a cut may still change at its edge (a
punctuation run that would have taken the line break after it, merges of a tokenizer that
does not split on white space).
"""

from __future__ import annotations

from collections.abc import Callable

from gpu_agent.engine import PromptTooLong

CHARS_PER_TOKEN_GUESS = 4
"""Characters of the first prefix tried, per token the context holds (English text runs about
four characters a token; text with fewer is tokenized whole on the first try)."""
CUT_SLACK_TOKENS = 8


def encode_within(encode: Callable[[str], list[int]], text: str, max_tokens: int) -> list[int]:
    """`encode(text)`, or `PromptTooLong` as soon as a prefix proves it has over `max_tokens`.

    A text tokenized whole is returned whatever its length: the caller says by how much it
    is over.
    """
    length = (max_tokens + 1) * CHARS_PER_TOKEN_GUESS
    while length < len(text):
        cut = text.rfind(" ", 0, length)
        prefix = text[: cut if cut > 0 else length]
        at_least = len(encode(prefix)) - CUT_SLACK_TOKENS
        if at_least > max_tokens:
            raise PromptTooLong(at_least)
        length *= 2
    return encode(text)
