from __future__ import annotations

import functools
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_agent.detokenizer import Decode, IncrementalDetokenizer, ResumeMismatch
from tests.support.tokenizers import FAMILIES, backend, held

# A byte-level vocabulary: token i is one or two raw bytes, as in byte-level BPE.
VOCAB = [bytes([b]) for b in range(256)] + ["日".encode()[:2], "é".encode(), b" a", b"\xe6\x97"]


def decode(ids: Sequence[int]) -> str:
    return b"".join(VOCAB[i] for i in ids).decode("utf-8", errors="replace")


token_lists = st.lists(st.integers(min_value=0, max_value=len(VOCAB) - 1), max_size=40)


def stream(ids: list[int], chunks: list[int], start: IncrementalDetokenizer) -> str:
    text, position = "", 0
    for size in chunks:
        text += start.push(ids[position : position + size])
        position += size
    text += start.push(ids[position:])
    return text + start.flush()


@given(ids=token_lists, sizes=st.lists(st.integers(min_value=0, max_value=4), max_size=20))
def test_deltas_concatenate_to_the_full_decode_whatever_the_chunking(
    ids: list[int], sizes: list[int]
) -> None:
    assert stream(ids, sizes, IncrementalDetokenizer(decode)) == decode(ids)


@given(
    ids=token_lists,
    cut=st.integers(min_value=0, max_value=40),
    sizes=st.lists(st.integers(min_value=1, max_value=3), max_size=20),
)
def test_a_resumed_stream_continues_exactly_where_the_client_is(
    ids: list[int], cut: int, sizes: list[int]
) -> None:
    cut = min(cut, len(ids))
    first = IncrementalDetokenizer(decode)
    sent = "".join(first.push([token]) for token in ids[:cut])  # interrupted: no flush

    resumed = IncrementalDetokenizer(decode, token_ids=ids[:cut], text=sent)
    rest = stream(ids[cut:], sizes, resumed)

    assert sent + rest == decode(ids)


@given(ids=token_lists, sizes=st.lists(st.integers(min_value=1, max_value=3), max_size=20))
def test_a_client_holding_the_whole_flushed_reply_resumes_to_nothing_more(
    ids: list[int], sizes: list[int]
) -> None:
    """Every delta came, the `done` did not: the text ends as the final flush left it."""
    whole = stream(ids, sizes, IncrementalDetokenizer(decode))

    resumed = IncrementalDetokenizer(decode, token_ids=ids, text=whole)

    assert resumed.flush() == ""
    with pytest.raises(ResumeMismatch):
        IncrementalDetokenizer(decode, token_ids=ids, text=whole + "x")


def test_unfinished_characters_are_held_back_until_complete() -> None:
    detok = IncrementalDetokenizer(decode)
    assert detok.push([0xE6]) == ""  # first byte of 日
    assert detok.push([0x97]) == ""
    assert detok.push([0xA5]) == "日"
    assert detok.push([ord("a")]) == "a"
    assert detok.push([0xC3]) == ""
    assert detok.flush() == "\ufffd"


def test_a_resume_whose_text_is_not_that_of_its_ids_is_refused() -> None:
    with pytest.raises(ResumeMismatch):
        IncrementalDetokenizer(decode, token_ids=[ord("a")], text="b")


# --- the published tokenizers ------------------------------------------------------------------


@functools.cache  # built once: listing Gemma3's 262k pieces takes longer than an example
def generated_ids(family: str) -> st.SearchStrategy[list[int]]:
    """Ids as a model may generate them: any piece, with byte pieces, multi-byte characters
    spelt in bytes, and special tokens mixed in."""
    tokenizer = backend(family)
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    special = sorted(i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special)
    bytes_of = [tokenizer.token_to_id(f"<0x{b:02X}>") for b in range(256)]
    pieces: list[st.SearchStrategy[list[int]]] = [
        st.integers(0, vocab - 1).map(lambda i: [i]),
        st.sampled_from(special).map(lambda i: [i]),
        # multi-byte characters as the tokenizer writes them (byte pieces, or byte-level pieces)
        st.sampled_from("日本語é€😀ж").map(
            lambda c: tokenizer.encode(c, add_special_tokens=False).ids
        ),
    ]
    if None not in bytes_of:
        pieces.append(st.integers(0, 255).map(lambda b: [bytes_of[b]]))
        pieces.append(st.sampled_from("日€😀é").map(lambda c: [bytes_of[b] for b in c.encode()]))
    return st.lists(st.one_of(pieces), max_size=30).map(
        lambda parts: [token for part in parts for token in part]
    )


def decoder(family: str) -> Decode:
    """The tokenizer's own decoding of a whole list, as the agent asks for it."""
    tokenizer = backend(family)
    return lambda ids: tokenizer.decode(list(ids), skip_special_tokens=True)


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_real_tokenizers_stream_exactly_their_own_decode(family: str, data: st.DataObject) -> None:
    ids = data.draw(generated_ids(family))
    sizes = data.draw(st.lists(st.integers(min_value=1, max_value=4), max_size=30))
    detokenizer = IncrementalDetokenizer(decoder(family), held_ids=held(family))
    assert stream(ids, sizes, detokenizer) == backend(family).decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("family", FAMILIES)
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_real_tokenizers_resume_exactly_at_every_cut(family: str, data: st.DataObject) -> None:
    decode_ids = decoder(family)
    ids = data.draw(generated_ids(family))
    whole = decode_ids(ids)
    for cut in range(len(ids) + 1):
        first = IncrementalDetokenizer(decode_ids, held_ids=held(family))
        sent = "".join(first.push([token]) for token in ids[:cut])
        # A stop string's hold-back may leave the client up to a few characters behind.
        sent = sent[: max(0, len(sent) - data.draw(st.integers(0, 3), label="held back"))]
        resumed = IncrementalDetokenizer(decode_ids, ids[:cut], sent, held_ids=held(family))
        assert sent + stream(ids[cut:], [1] * len(ids), resumed) == whole, cut


def test_llama2_keeps_the_spaces_a_piece_decoded_alone_loses() -> None:
    ids = backend("llama2").encode("tobaccoicipmajor recon dess", add_special_tokens=False).ids
    detokenizer = IncrementalDetokenizer(decoder("llama2"), held_ids=held("llama2"))
    deltas = [detokenizer.push([token]) for token in ids]
    assert "".join(deltas) + detokenizer.flush() == "tobaccoicipmajor recon dess"
    assert " recon" in deltas
