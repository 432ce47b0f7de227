"""Thinking told from the answer: a pure function of the text so far, exact at every cut."""

from __future__ import annotations

import pytest

from gpu_agent.reasoning import (
    ReasoningParserUnusable,
    ReasoningTokens,
    ReplyReasoning,
    ThinkTags,
    split_reasoning,
    think_tags,
)
from tests.support.tokenizers import auto_tokenizer

TAGS = ThinkTags("<think>", "</think>", 1, 2)

REPLIES = {
    "opened by the model": ("<think>\nLet me think.\n</think>\n\nThe answer is 4.",
                            ("\nLet me think.\n", "\n\nThe answer is 4.")),
    "opened by the template": ("Let me think.\n</think>\n\nFour.",
                               ("Let me think.\n", "\n\nFour.")),
    "tag-like text inside": ("<think>a < b and </th is not </thin</think>ok", (
        "a < b and </th is not </thin", "ok")),
    "cut while thinking": ("<think>still going", ("still going", "")),
    "a tool call after": ("<think>x</think>\n<tool_call>{}</tool_call>",
                          ("x", "\n<tool_call>{}</tool_call>")),
    "only the opening tag, cut": ("<thi", ("<thi", "")),
    "empty": ("", ("", "")),
}  # fmt: skip


@pytest.mark.parametrize(("text", "split"), REPLIES.values(), ids=REPLIES.keys())
def test_a_whole_reply_splits_as_vllms_parsers_split_it(text: str, split: tuple[str, str]) -> None:
    assert split_reasoning(text, TAGS, final=True) == split


def streamed(reasoning: ReplyReasoning, chunks: list[str]) -> tuple[str, str]:
    parts = [reasoning.feed(chunk) for chunk in chunks] + [reasoning.finish()]
    return "".join(p[0] for p in parts), "".join(p[1] for p in parts)


@pytest.mark.parametrize(("text", "split"), REPLIES.values(), ids=REPLIES.keys())
def test_streamed_in_any_chunks_or_moved_at_any_cut_the_parts_are_the_whole_replys(
    text: str, split: tuple[str, str]
) -> None:
    assert streamed(ReplyReasoning(TAGS), list(text)) == split
    for cut in range(len(text) + 1):
        before, after = text[:cut], text[cut:]
        # What the client had at the cut, and what an agent continuing from it then adds.
        shown = split_reasoning(before, TAGS, final=False)
        moved = ReplyReasoning(TAGS, before)
        assert moved.initial_answer == shown[1]
        rest = streamed(moved, [after[:3], after[3:]])
        assert (shown[0] + rest[0], shown[1] + rest[1]) == split, cut


def test_each_part_only_grows_as_text_comes() -> None:
    text = REPLIES["tag-like text inside"][0]
    previous = ("", "")
    for end in range(len(text) + 1):
        now = split_reasoning(text[:end], TAGS, final=False)
        assert now[0].startswith(previous[0])
        assert now[1].startswith(previous[1])
        previous = now


PROMPT_TAILS = {
    "thinking on (Qwen3)": ("<|im_start|>assistant\n", False),
    "thinking off (Qwen3's enable_thinking: false)": (
        "<|im_start|>assistant\n<think>\n\n</think>\n\n", True),
    "opened in the prompt (DeepSeek-R1)": ("<｜Assistant｜><think>\n", False),
    "a tool loop's earlier turn, then a new one": ("</think>x<|im_end|>\n<think>", False),
}  # fmt: skip


@pytest.mark.parametrize(("tail", "closed"), PROMPT_TAILS.values(), ids=PROMPT_TAILS.keys())
def test_a_prompt_that_ended_the_thinking_is_told(tail: str, closed: bool) -> None:
    assert TAGS.closed_in_prompt(tail) is closed


def test_thinking_tokens_are_those_before_the_closing_tag_tags_left_out() -> None:
    counted = ReasoningTokens(TAGS, [1, 10, 11])
    counted.add([12, 2, 13, 14, 2])
    assert counted.count == 3
    assert ReasoningTokens(ThinkTags("<t>", "</t>"), [5, 6]).count is None  # tags not one token


@pytest.mark.parametrize("parser", ["qwen3", "deepseek_r1"])
def test_vllms_parsers_name_the_tags_as_the_agents_text_has_them(parser: str) -> None:
    tags = think_tags(parser, auto_tokenizer("qwen3"))
    assert tags == ThinkTags("<think>", "</think>", 151667, 151668)


@pytest.mark.parametrize(
    ("parser", "says"),
    [("no_such_parser", "no reasoning parser 'no_such_parser' in vLLM; it has: "),
     ("openai_gptoss", "without text tags")],
)  # fmt: skip
def test_a_parser_that_cannot_split_by_tags_is_one_clear_line(parser: str, says: str) -> None:
    with pytest.raises(ReasoningParserUnusable, match=says):
        think_tags(parser, auto_tokenizer("qwen3"))


THINK_THEN_CALL = (
    "<think>\nThe user wants Oslo's weather.\n</think>\n\nChecking.\n<tool_call>\n"
    '{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
)


def test_a_reply_that_thinks_then_calls_a_tool_reads_alike_from_any_cut() -> None:
    from gpu_agent.reply_text import ReplyReader
    from gpu_agent.tool_calls import ToolCallReader
    from spotgate.protocol import FunctionDefinition, Tool

    tokenizer = auto_tokenizer("qwen3")
    tags = think_tags("qwen3", tokenizer)
    tools = [Tool(function=FunctionDefinition(name="get_weather"))]

    def reader(text: str) -> ReplyReader:
        tool_reader = ToolCallReader("hermes", tokenizer, tools)
        return ReplyReader(ReplyReasoning(tags, text), tool_reader, text, show_reasoning=True)

    def read(before: str, after: str) -> tuple[str, str, list[str]]:
        """What a client sees: from an agent that stopped after `before`, then one that went on."""
        shown = reader("").feed(before)
        moved = reader(before)
        parts = [shown, moved.feed(after[:5]), moved.feed(after[5:])]
        rest, calls = moved.finish()
        parts.append(rest)
        thinking = "".join(part[1] or "" for part in parts)
        content = "".join(part[0] or "" for part in parts)
        return thinking, content, [call.function.name for call in calls or ()]

    unmoved = read("", THINK_THEN_CALL)
    assert unmoved == ("\nThe user wants Oslo's weather.\n", "\n\nChecking.\n", ["get_weather"])
    for cut in range(len(THINK_THEN_CALL)):
        assert read(THINK_THEN_CALL[:cut], THINK_THEN_CALL[cut:]) == unmoved, cut
