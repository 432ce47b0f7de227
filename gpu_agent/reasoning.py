"""A reasoning model's thinking, told from its answer as the reply streams.

Reasoning models (Qwen3, DeepSeek-R1 and the many that write as they do) think between two
tags, `<think>` and `</think>`, then answer. Which tags a model uses is what vLLM's reasoning
parser for it knows, chosen per model in the agent's settings (`reasoning_parser`). What is
thinking and what is answer is then a pure function of the reply's text so far, as vLLM's
parsers split a whole reply: the thinking runs from the reply's start (after the opening tag,
if the model writes one; a template may open it in the prompt) to the closing tag, the answer
is all that follows it. So an agent that continues a moved stream knows, from the text the
client already has, exactly how much of each it was shown, and the split stays exact across
the move.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gpu_agent.tool_calls import held_back

GENERATION_PROMPT_TOKENS = 8
"""The end of a chat prompt where a template says whether the model thinks: its assistant
turn's opening, then an opened `<think>` (thinking) or an empty closed pair (Qwen3's
`enable_thinking: false`)."""


class ReasoningParserUnusable(ValueError):
    """The configured reasoning parser cannot tell this model's thinking from its answer."""


@dataclass(frozen=True, slots=True)
class ThinkTags:
    """The tags a model's thinking sits between, and their token ids where each is one token."""

    start: str
    end: str
    start_id: int | None = None
    end_id: int | None = None

    def closed_in_prompt(self, prompt_tail: str) -> bool:
        """Whether the prompt already ended the thinking (the template turned it off)."""
        ends = prompt_tail.rfind(self.end)
        return ends >= 0 and ends > prompt_tail.rfind(self.start)


def think_tags(parser_name: str, tokenizer: Any) -> ThinkTags:
    """The tags of vLLM's reasoning parser `parser_name`, as the agent's decoded text has them.

    Raises `ReasoningParserUnusable` for a parser vLLM does not have, or one whose model does
    not think between text tags (gpt-oss's channels, say).
    """
    from vllm.reasoning import ReasoningParserManager

    try:
        parser_class = ReasoningParserManager.get_reasoning_parser(parser_name)
    except KeyError as err:
        known = ", ".join(ReasoningParserManager.list_registered())
        raise ReasoningParserUnusable(
            f"no reasoning parser '{parser_name}' in vLLM; it has: {known}"
        ) from err
    try:
        parser = parser_class(tokenizer)
    except Exception as err:
        raise ReasoningParserUnusable(
            f"reasoning parser '{parser_name}' does not fit this model's tokenizer: {err}"
        ) from err
    # Tag parsers keep them as `start_token`/`end_token`; parser engines (Qwen3's) as constants.
    engine = getattr(parser, "_parser_engine", None)
    start = getattr(parser, "start_token", None) or getattr(engine, "THINK_START", None)
    end = getattr(parser, "end_token", None) or getattr(engine, "THINK_END", None)
    if not (isinstance(start, str) and isinstance(end, str) and start and end):
        raise ReasoningParserUnusable(
            f"reasoning parser '{parser_name}' marks thinking without text tags; the agent "
            "splits replies by tags (qwen3, deepseek_r1 and the parsers like them)"
        )
    for tag in (start, end):
        if tokenizer.decode(tokenizer.encode(tag, add_special_tokens=False)) != tag:
            raise ReasoningParserUnusable(
                f"reasoning parser '{parser_name}': {tag} is not text in this tokenizer"
            )
    return ThinkTags(start, end, _single_id(tokenizer, start), _single_id(tokenizer, end))


def _single_id(tokenizer: Any, tag: str) -> int | None:
    ids = tokenizer.encode(tag, add_special_tokens=False)
    return int(ids[0]) if len(ids) == 1 else None


def split_reasoning(text: str, tags: ThinkTags, *, final: bool) -> tuple[str, str]:
    """(thinking, answer) surely known from a reply's text so far (`final`: the whole reply).

    Text that may still become a tag is held back. Each part only grows as text is appended,
    whatever the split into chunks.
    """
    if text.startswith(tags.start):
        return _thinking_and_answer(text[len(tags.start) :], tags.end, final=final)
    if tags.start.startswith(text) and not final:
        return "", ""  # the opening tag, perhaps, still being written
    return _thinking_and_answer(text, tags.end, final=final)  # opened by the template, or none


def _thinking_and_answer(body: str, end: str, *, final: bool) -> tuple[str, str]:
    """The thinking and answer of a reply's text after any opening tag."""
    ends = body.find(end)
    if ends >= 0:
        return body[:ends], body[ends + len(end) :]
    sure = len(body) if final else len(body) - held_back(body, end)
    return body[:sure], ""


class ReplyReasoning:
    """The thinking and the answer of a reply, as it streams: `split_reasoning`, step by step.

    Starts from the text a client already has (a moved stream's); `feed` takes more text and
    returns the thinking and the answer newly sure, `finish` what is left once it is whole.
    Only text still unsure is kept, so a step costs the same however long the reply is.
    """

    def __init__(self, tags: ThinkTags, text: str = "") -> None:
        self.tags = tags
        self._opening: str | None = ""  # the reply's start while it may be the opening tag
        self._unsure = ""  # thinking that may be the start of the closing tag
        self._answering = False
        self.initial_answer = self.feed(text)[1]  # what of `text` is answer, surely

    def feed(self, text: str) -> tuple[str, str]:
        """Thinking and answer newly sure after `text` is appended."""
        return self._advance(text, final=False)

    def finish(self) -> tuple[str, str]:
        """The rest of the thinking and of the answer, the reply being whole."""
        return self._advance("", final=True)

    def _advance(self, text: str, *, final: bool) -> tuple[str, str]:
        if self._answering:
            return "", text
        if self._opening is not None:
            opening = self._opening + text
            start = self.tags.start
            if start.startswith(opening) and opening != start and not final:
                self._opening = opening
                return "", ""
            self._opening = None
            text = opening[len(start) :] if opening.startswith(start) else opening
        body = self._unsure + text
        thinking, answer = _thinking_and_answer(body, self.tags.end, final=final)
        self._answering = self.tags.end in body
        self._unsure = "" if self._answering else body[len(thinking) :]
        return thinking, answer


class ReasoningTokens:
    """How many of a reply's tokens are thinking: those before the closing tag, tags left out.

    Counted from token ids, the tags being one token each (as the models' vocabularies have
    them); `count` is None where they are not.
    """

    def __init__(self, tags: ThinkTags, ids: Sequence[int] = ()) -> None:
        self._tags = tags
        self._count = 0
        self._ended = False
        self.add(ids)

    @property
    def count(self) -> int | None:
        """Thinking tokens so far."""
        return self._count if self._tags.end_id is not None else None

    def add(self, ids: Sequence[int]) -> None:
        """Count more of the reply's ids."""
        for token in ids:
            if self._ended:
                return
            if token == self._tags.end_id:
                self._ended = True
            elif token != self._tags.start_id:
                self._count += 1
