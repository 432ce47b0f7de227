"""A reply's tokens' bytes join to its UTF-8, on each published tokenizer."""

from __future__ import annotations

import functools

import pytest

from gpu_agent.token_bytes import TokenBytes
from tests.support.tokenizers import FAMILIES, backend

TEXTS = [
    "Hello world",
    " a leading space",
    "naïve café — 日本語のテキスト 🚀🎉 done",
    "x\n\n  y\tz",
    "€uro 𝄞 music, ½ and ⅞",
    "ok",
]


@functools.cache
def token_bytes(family: str) -> TokenBytes:
    tokenizer = backend(family)
    return TokenBytes(tokenizer.to_str(), tokenizer.id_to_token)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("text", TEXTS)
def test_the_bytes_of_a_replys_tokens_join_to_what_the_decoder_writes(
    family: str, text: str
) -> None:
    tokenizer = backend(family)
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    table = token_bytes(family)

    joined = b"".join(table.of(token, first=index == 0) for index, token in enumerate(ids))

    assert joined == tokenizer.decode(ids, skip_special_tokens=True).encode()


def test_a_byte_fallback_piece_is_its_one_byte_not_a_replacement_character() -> None:
    tokenizer = backend("llama2")
    piece = tokenizer.token_to_id("<0xE2>")

    assert tokenizer.decode([piece]) == "\ufffd"  # three bytes, alone
    assert token_bytes("llama2").of(piece, first=False) == b"\xe2"


def test_a_sentencepiece_space_is_stripped_only_where_the_reply_opens() -> None:
    piece = backend("llama2").token_to_id("\u2581Hello")

    assert token_bytes("llama2").of(piece, first=True) == b"Hello"
    assert token_bytes("llama2").of(piece, first=False) == b" Hello"
    assert token_bytes("gemma3").of(backend("gemma3").token_to_id("\u2581Hello"), first=True) == (
        b" Hello"  # Gemma's decoder strips nothing
    )


def test_special_tokens_add_nothing_as_the_decoder_leaves_them_out() -> None:
    tokenizer = backend("qwen3")
    end = tokenizer.token_to_id("<|im_end|>")

    assert token_bytes("qwen3").of(end, first=False) == b""
