"""The content of a reply that may call tools: a pure function of its text, whatever the split."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_agent.tool_calls import ReplyContent, held_back, shown_content

MARKER = "<tool_call>"
CALL = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>'


@pytest.mark.parametrize(
    ("text", "markers", "shown"),
    [
        ("Hello", [MARKER], 5),
        ("Hello <tool", [MARKER], 6),  # may open a call: held back
        ("Hello <tool_call>{", [MARKER], 6),
        ("a < b", [MARKER], 5),  # '<' then ' ' cannot open one
        ("a <", [MARKER], 2),
        ("x[TOOL_CALLS]y<tool_call>", [MARKER, "[TOOL_CALLS]"], 1),  # the first marker counts
        ("anything at all", [], 0),  # no marker known: a call may begin anywhere
        ("", [MARKER], 0),
    ],
)
def test_shown_content_stops_at_what_may_open_a_call(
    text: str, markers: list[str], shown: int
) -> None:
    assert shown_content(text, markers) == shown


def test_held_back_is_the_longest_marker_prefix_at_the_end() -> None:
    assert held_back("abc<tool_ca", MARKER) == len("<tool_ca")
    assert held_back("abc<tool_call", MARKER) == len("<tool_call")
    assert held_back("abc", MARKER) == 0


def test_a_reply_with_a_call_shows_the_text_before_it_and_holds_the_markup() -> None:
    content = ReplyContent([MARKER])
    shown = [content.feed(piece) for piece in ["Let me", " check.<tool", "_call>\n{", '"name"']]
    assert shown == ["Let me", " check.", "", ""]
    assert content.finish("Let me check.") == ""


def test_a_reply_without_a_call_releases_what_it_held() -> None:
    content = ReplyContent([MARKER])
    assert content.feed("1 <tool") == "1 "
    assert content.finish(None) == "<tool"


def test_content_a_parser_trimmed_never_takes_back_what_was_shown() -> None:
    content = ReplyContent([MARKER])
    assert content.feed("Sure. " + CALL) == "Sure. "
    assert content.finish("Sure.") == ""


texts = st.lists(st.sampled_from([*"ab <_tolc>{}", MARKER, CALL]), max_size=30).map("".join)


@given(text=texts, cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8))
def test_the_content_is_the_same_whatever_the_split_and_wherever_a_move_resumes(
    text: str, cuts: list[int]
) -> None:
    def streamed(pieces: list[str], start: str = "") -> tuple[str, ReplyContent]:
        content = ReplyContent([MARKER], start)
        return "".join(content.feed(piece) for piece in pieces), content

    bounds = sorted({0, len(text), *(cut % (len(text) + 1) for cut in cuts)})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    whole, _ = streamed([text])
    split, _ = streamed(pieces)
    assert split == whole == text[: shown_content(text, [MARKER])]

    # A move after any piece: the new agent starts from the text the client has.
    for index in range(len(pieces)):
        before, _ = streamed(pieces[:index])
        after, content = streamed(pieces[index:], "".join(pieces[:index]))
        assert before + after == whole
        assert content.text == text
