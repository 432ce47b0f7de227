"""Tool calls a model makes of its own accord (`tool_choice: auto`), read from its reply text.

The model writes a call in its own markup (Qwen's `<tool_call>{…}</tool_call>`, …), which one
of vLLM's tool-call parsers, chosen per model in the agent's settings, turns into OpenAI's
calls once the reply is whole. While the reply streams, the text before the markup is its
content and the markup is held back: what is content is a pure function of the text so far,
so an agent that continues a moved stream knows, from the text the client already has,
exactly what content was shown, and the client sees one unbroken reply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spotgate.openai_replies import tool_call_id
from spotgate.protocol import FunctionCall, Tool, ToolCall

MARKER_ATTRIBUTES = ("tool_calls_start_token", "tool_call_start_token", "bot_token")
"""Where vLLM's parsers keep the text that opens a call's markup."""


class ToolParserUnusable(ValueError):
    """The configured tool-call parser cannot read this model's replies."""


def held_back(text: str, marker: str) -> int:
    """Characters at the end of `text` that may be the start of `marker`."""
    for length in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:length]):
            return length
    return 0


def shown_content(text: str, markers: Sequence[str]) -> int:
    """How much of a reply's text so far is surely content: what precedes any call markup.

    Without markers a call may begin anywhere, so nothing is sure before the reply ends.
    Non-decreasing as text is appended, whatever the split.
    """
    if not markers:
        return 0
    found = [index for marker in markers if (index := text.find(marker)) >= 0]
    if found:
        return min(found)
    return len(text) - max(held_back(text, marker) for marker in markers)


class ReplyContent:
    """The content of a reply whose text may hold tool calls, as it streams.

    Starts from the text a client already has (a moved stream's); `feed` takes more text and
    returns the content to show now, `finish` what is left once the reply is whole.
    """

    def __init__(self, markers: Sequence[str], text: str = "") -> None:
        self.markers = markers
        self._chunks = [text]
        self.shown = shown_content(text, markers)
        self._markup = any(marker in text for marker in markers)
        self._tail = text[self.shown :]  # where a marker may still begin

    @property
    def text(self) -> str:
        """All of the reply's text so far."""
        return "".join(self._chunks)

    def feed(self, text: str) -> str:
        """Content newly sure after `text` is appended."""
        self._chunks.append(text)
        if self._markup or not self.markers:
            return ""
        self._tail += text
        sure = shown_content(self._tail, self.markers)
        self._markup = any(marker in self._tail for marker in self.markers)
        content = self._tail[:sure]
        self.shown += sure
        self._tail = self._tail[sure:]
        return content

    def finish(self, content: str | None) -> str:
        """The rest of the content, given the whole reply's (None: no calls, all is content)."""
        text = self.text
        whole = text if content is None else content
        if not whole.startswith(text[: self.shown]):
            whole = text[: self.shown]  # a parser's trimmed content: keep what was shown
        rest = whole[self.shown :]
        self.shown = len(whole)
        return rest


@dataclass(frozen=True)
class ParsedReply:
    """A whole reply read for tool calls: its content (None: the whole text) and its calls."""

    content: str | None
    calls: list[ToolCall]


class ToolCallReader:
    """One of vLLM's tool-call parsers, for the replies of one request's tools.

    `markers`: the texts that open call markup, as they appear in the agent's decoded text;
    they depend on the parser and tokenizer alone, so an engine passes those it found once.
    """

    def __init__(
        self,
        parser_name: str,
        tokenizer: Any,
        tools: Sequence[Tool],
        markers: Sequence[str] | None = None,
    ) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import (
            ChatCompletionRequest,
            ChatCompletionToolsParam,
        )
        from vllm.tool_parsers import ToolParserManager

        try:
            parser_class = ToolParserManager.get_tool_parser(parser_name)
        except KeyError as err:
            known = ", ".join(
                sorted({*ToolParserManager.tool_parsers, *ToolParserManager.lazy_parsers})
            )
            raise ToolParserUnusable(
                f"no tool-call parser '{parser_name}' in vLLM; it has: {known}"
            ) from err
        offered: list[Any] = [
            ChatCompletionToolsParam.model_validate(tool.model_dump()) for tool in tools
        ]
        self._parser = parser_class(tokenizer, offered)
        self._request = ChatCompletionRequest(
            model="spotgate", messages=[{"role": "user", "content": ""}], tools=offered or None
        )
        if markers is not None:
            self.markers = list(markers)
            return
        declared = {
            marker
            for attribute in MARKER_ATTRIBUTES
            if isinstance(marker := getattr(self._parser, attribute, None), str) and marker
        }
        self.markers = sorted(
            marker
            for marker in declared
            if tokenizer.decode(
                tokenizer.encode(marker, add_special_tokens=False), skip_special_tokens=True
            )
            == marker
        )
        if declared and not self.markers:
            raise ToolParserUnusable(
                f"tool-call parser '{parser_name}' opens calls with {sorted(declared)}, special "
                "tokens that the agent's text leaves out; choose a parser whose markup is text"
            )

    def read(self, text: str) -> ParsedReply:
        """The calls in a whole reply; none (and all of it content) if it holds no valid call."""
        found = self._parser.extract_tool_calls(text, self._request)
        if not found.tools_called:
            return ParsedReply(None, [])
        calls = [
            ToolCall(
                id=tool_call_id(),
                function=FunctionCall(name=call.function.name, arguments=call.function.arguments),
            )
            for call in found.tool_calls
        ]
        return ParsedReply(found.content or "", calls)
