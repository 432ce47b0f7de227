"""A prompt is tokenized only as far as it takes to prove it too long, on every tokenizer."""

from __future__ import annotations

import pytest

from gpu_agent.bounded_encode import encode_within
from gpu_agent.engine import PromptTooLong
from tests.support.tokenizers import FAMILIES, backend

WORDS = "harbour crane berth 港湾 クレーン def f(x): return x**2 ½ — naïve, café. \n\n"
TEXTS = {
    "prose": " ".join(f"word{n} and more" for n in range(3000)),
    "mixed": WORDS * 400,
    "no spaces": "x" * 30_000,
}


class CountingEncode:
    """A tokenizer's encode, counting the characters it was given."""

    def __init__(self, family: str) -> None:
        self._tokenizer = backend(family)
        self.chars = 0

    def __call__(self, text: str) -> list[int]:
        self.chars += len(text)
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("text", TEXTS.values(), ids=TEXTS.keys())
@pytest.mark.parametrize("max_tokens", [100, 2000, 100_000])
def test_a_prompt_is_tokenized_whole_or_proven_too_long_by_a_part(
    family: str, text: str, max_tokens: int
) -> None:
    whole = CountingEncode(family)(text)
    encode = CountingEncode(family)

    try:
        ids = encode_within(encode, text, max_tokens)
    except PromptTooLong as err:
        assert max_tokens < err.at_least_tokens <= len(whole)  # a sound bound: never a fit
        assert encode.chars < len(text)  # and found on a part of the text
    else:
        assert ids == whole
        assert len(whole) <= max_tokens or encode.chars >= len(text)


def test_the_cost_of_a_refusal_is_bounded_by_the_context_not_the_prompt() -> None:
    encode = CountingEncode("qwen3")
    text = TEXTS["prose"] * 10  # about 600,000 characters

    with pytest.raises(PromptTooLong):
        encode_within(encode, text, 2000)

    assert encode.chars < 40_000
