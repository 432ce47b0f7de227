from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from gpu_agent.detokenizer import IncrementalDetokenizer

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


def test_unfinished_characters_are_held_back_until_complete() -> None:
    detok = IncrementalDetokenizer(decode)
    assert detok.push([0xE6]) == ""  # first byte of 日
    assert detok.push([0x97]) == ""
    assert detok.push([0xA5]) == "日"
    assert detok.push([ord("a")]) == "a"
    assert detok.push([0xC3]) == ""
    assert detok.flush() == "\ufffd"
